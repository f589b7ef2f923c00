"""tformer's encoder-decoder against Hugging Face MarianMTModel at the Multi30k recipe's shape (3 + 3 layers,
width 256, feed-forward 512, 8 heads, 8,000-token joint vocabulary), float32, one process, interleaved.

  train      a training step on the recipe's own batches (Multi30k pairs, up to 2,048 tokens a side):
             forward, label-smoothed cross-entropy (0.1) on the logits, backward, AdamW; the same random
             weights on both sides (the HF model written with save_pretrained and read by tformer.load)
  translate  beam-5 translation of test_2016_flickr (1,000 sentences, 64 at a time, sorted by length) with the
             trained run's weights loaded both ways (the run saved as a Marian folder: tformer lays the
             paper's interleaved positions out as Marian's split table, the same function), the same maximum
             length; sentences/s, and whether every output is the same token for token

Ratios are HF time / tformer time (> 1: tformer is faster).

    python benchmarks/translation_speed.py [--run runs/multi30k-de-en-transformer] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_path  # noqa: E402

import tformer  # noqa: E402
from benchmarks.timing import interleaved  # noqa: E402
from tformer.data.parallel import read_parallel, text_lines  # noqa: E402
from tformer.generation.translation import new_token_budget  # noqa: E402
from tformer.training.config import TrainingConfig  # noqa: E402
from tformer.training.distributed import ProcessContext  # noqa: E402
from tformer.training.tasks.translation import Translation, learn_joint_bpe  # noqa: E402

DATA = data_path("multi30k")
SMOOTHING = 0.1


def marian_pair(folder: Path):
    """A random MarianMTModel at the recipe's shape and tformer's load of the same weights."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=8000, decoder_vocab_size=8000, d_model=256, encoder_layers=3, decoder_layers=3,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=512, decoder_ffn_dim=512,
        max_position_embeddings=256, activation_function="relu", scale_embedding=True, dropout=0.1,
        pad_token_id=0, eos_token_id=2, decoder_start_token_id=1, forced_eos_token_id=None,
    )
    hf = transformers.MarianMTModel(config)
    hf.save_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = tformer.load(folder)
    return hf.train(), ours.train()


def recipe_batches(count: int) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` training batches the Multi30k recipe's task draws."""
    pairs = read_parallel(DATA / "train", "de", "en")
    task = Translation(pairs, None, learn_joint_bpe(pairs, 8000), seq_len=128, batch_tokens=2048, eval_bleu=False)
    model = tformer.build_model("transformer-multi30k")
    task.prepare(TrainingConfig(batch_size=128, seq_len=128), ProcessContext(0, 1), model)
    return [task.train_batch(position) for position in range(count)]


def training_step(model, batches):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    position = [0]

    def step() -> None:
        batch = batches[position[0] % len(batches)]
        position[0] += 1
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                  "decoder_input_ids": batch["decoder_input_ids"]}
        logits = model(**inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                                                 label_smoothing=SMOOTHING)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def measure_training(rounds: int, steps: int) -> dict[str, float]:
    batches = recipe_batches(12)
    with tempfile.TemporaryDirectory() as folder:
        hf, ours = marian_pair(Path(folder))
    times = interleaved({"tformer": training_step(ours, batches),
                         "transformers": training_step(hf, batches)}, rounds, steps)
    return {name: statistics.median(values) for name, values in times.items()}


def sorted_batches(ids: list[list[int]], size: int) -> list[list[int]]:
    order = sorted(range(len(ids)), key=lambda row: len(ids[row]))
    return [order[start : start + size] for start in range(0, len(order), size)]


def padded(ids: list[list[int]], rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(ids[row]) for row in rows)
    input_ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for index, row in enumerate(rows):
        input_ids[index, : len(ids[row])] = torch.tensor(ids[row])
        mask[index, : len(ids[row])] = 1
    return input_ids, mask


def through_end(row: list[int], end_id: int = 2) -> list[int]:
    """A generated row up to its end token: what follows is filler (tformer pads with 0, generate with
    the end token)."""
    return row[: row.index(end_id, 1) + 1] if end_id in row[1:] else row


def measure_translation(run: Path, rounds: int) -> dict[str, object]:
    import transformers

    transformers.logging.set_verbosity_error()
    trained = tformer.load(run).eval()
    tokenizer = trained.tokenizer
    sources = text_lines(DATA / "test_2016_flickr.de.gz")
    ids = [[*tokenizer.encode(line, add_special_tokens=False), tokenizer.eos_token_id] for line in sources]
    budget = new_token_budget(trained, max(len(row) for row in ids))
    with tempfile.TemporaryDirectory() as folder:
        trained.save(Path(folder), format="hf")
        hf = transformers.MarianMTModel.from_pretrained(folder).eval()
        ours = tformer.load(folder).eval()
    batches = sorted_batches(ids, 64)
    outputs: dict[str, list[list[int]]] = {}

    def translate_all(name: str, model) -> None:
        results = []
        with torch.inference_mode():
            for rows in batches:
                input_ids, mask = padded(ids, rows)
                if name == "tformer":
                    out = tformer.generate(model, input_ids, budget, attention_mask=mask, num_beams=5)
                else:
                    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=budget, num_beams=5,
                                         do_sample=False, eos_token_id=2, pad_token_id=0, decoder_start_token_id=1)
                results += [through_end(row.tolist()) for row in out]
        outputs[name] = results

    times = interleaved({"tformer": lambda: translate_all("tformer", ours),
                         "transformers": lambda: translate_all("transformers", hf)}, rounds, 1, warm_up=False)
    pairs = list(zip(outputs["tformer"], outputs["transformers"], strict=True))
    order = [row for rows in batches for row in rows]  # outputs come in batch order
    for position, (ours_row, theirs_row) in enumerate(pairs):
        if ours_row != theirs_row:
            print(f"different: line {order[position] + 1}\n  tformer      {tokenizer.decode(ours_row[1:], True)}\n"
                  f"  transformers {tokenizer.decode(theirs_row[1:], True)}")
    return {"seconds": {name: statistics.median(values) for name, values in times.items()},
            "sentences": len(sources), "identical": sum(a == b for a, b in pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default=str(ROOT / "runs" / "multi30k-de-en-transformer"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="training steps a round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=["train", "translate"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    if args.only != "translate":
        step = measure_training(args.rounds, args.steps)
        print(f"training step (median s): tformer {step['tformer']:.3f}, transformers {step['transformers']:.3f}, "
              f"ratio {step['transformers'] / step['tformer']:.2f}")
    if args.only != "train":
        result = measure_translation(Path(args.run), args.rounds)
        seconds, count = result["seconds"], result["sentences"]
        print(f"beam-5 translation of {count} sentences (median s): tformer {seconds['tformer']:.1f} "
              f"({count / seconds['tformer']:.1f} sentences/s), transformers generate {seconds['transformers']:.1f} "
              f"({count / seconds['transformers']:.1f} sentences/s), ratio "
              f"{seconds['transformers'] / seconds['tformer']:.2f}; identical outputs {result['identical']} of {count}")


if __name__ == "__main__":
    main()
