"""tformer's encoder against Hugging Face transformers at bert-mini (4 layers, width 256, 4 heads,
vocab 30522), sequence 128, batch 32, float32, in one process, interleaved round by round.

Three measurements, each with the same weights on both sides (the HF model is written with
``save_pretrained`` and read with ``tformer.load``), the same batch and the same optimiser:
  mlm       a masked-LM pretraining step: forward with labels (15% of positions), backward, AdamW;
            both sides compute logits at every position
  mlm-sparse  the same step, tformer with ``labelled_logits_only=True`` (logits only where a label
            is; the same loss and gradients), against the same HF step as ``mlm``
  classify  a sequence-classification fine-tuning step (2 labels), padded batch, same loop
  infer     classification inference (eval, inference_mode), padded batch: examples per second

HF runs BertForMaskedLM / BertForSequenceClassification with its default attention (SDPA).
Ratios are HF time / tformer time (> 1: tformer is faster).

    python benchmarks/encoder_speed.py [--rounds 5] [--steps 3] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tformer  # noqa: E402
from benchmarks.timing import interleaved  # noqa: E402

BATCH, LENGTH = 32, 128


def batch(padded: bool, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A pair batch: segment B from the middle; ``padded``: each row 64..128 real tokens."""
    input_ids = torch.randint(1000, 30522, (BATCH, LENGTH), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if padded:
        lengths = torch.randint(64, LENGTH + 1, (BATCH,), generator=generator)
        attention_mask = (torch.arange(LENGTH)[None] < lengths[:, None]).long()
        input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, LENGTH // 2:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def pair(class_name: str, folder: Path):
    """The HF model of ``class_name`` at bert-mini's shape, and tformer's load of the same weights."""
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024)
    reference = getattr(transformers, class_name)(config)
    reference.save_pretrained(folder / class_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = tformer.load(folder / class_name)
    return reference, ours


def train_step(model, optimizer, inputs) -> None:
    loss = model(**inputs).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    full, padded = batch(False, generator), batch(True, generator)
    chosen = torch.rand(BATCH, LENGTH, generator=generator) < 0.15
    mlm_inputs = {**full, "labels": full["input_ids"].masked_fill(~chosen, -100)}
    classify_inputs = {**padded, "labels": torch.randint(0, 2, (BATCH,), generator=generator)}

    with tempfile.TemporaryDirectory() as folder:
        models = {"mlm": pair("BertForMaskedLM", Path(folder)), "classify": pair("BertForSequenceClassification",
                                                                                    Path(folder))}
    work = {}
    for kind, inputs in (("mlm", mlm_inputs), ("classify", classify_inputs)):
        for side, model in zip(("hf", "tformer"), models[kind], strict=True):
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            work[kind, side] = (lambda m=model, o=optimizer, i=inputs: train_step(m, o, i))
    sparse_model = models["mlm"][1]
    sparse_optimizer = torch.optim.AdamW(sparse_model.parameters(), lr=1e-4)
    work["mlm-sparse", "tformer"] = lambda: train_step(sparse_model, sparse_optimizer,
                                                       {**mlm_inputs, "labelled_logits_only": True})
    infer_models = pair("BertForSequenceClassification", Path(tempfile.mkdtemp()))
    for side, model in zip(("hf", "tformer"), infer_models, strict=True):
        model.eval()

        def infer(m=model) -> None:
            with torch.inference_mode():
                m(**padded)

        work["infer", side] = infer

    print(f"bert-mini, batch {BATCH}, sequence {LENGTH}, float32, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    times = interleaved(work, args.rounds, args.steps)
    for kind in ("mlm", "mlm-sparse", "classify", "infer"):
        hf = statistics.median(times["mlm" if kind == "mlm-sparse" else kind, "hf"])
        ours = statistics.median(times[kind, "tformer"])
        if kind == "infer":
            print(f"{kind:10s} HF {BATCH / hf:7.1f} examples/s, tformer {BATCH / ours:7.1f} examples/s, "
                  f"ratio {hf / ours:.3f}")
        else:
            print(f"{kind:10s} HF {hf * 1000:7.1f} ms/step, tformer {ours * 1000:7.1f} ms/step, ratio {hf / ours:.3f}")


if __name__ == "__main__":
    main()
