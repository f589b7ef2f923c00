"""tformer's Vision Transformer against Hugging Face transformers' ViTForImageClassification at the
MNIST preset (vit-mnist: 28 x 28 grey images in 4 x 4 patches, width 128, 6 layers, 4 heads, 10
labels), batch 128, float32, in one process, interleaved round by round.

Both sides hold the same weights (the HF model is written with ``save_pretrained`` and read with
``tformer.load``) and see the same batch:
  train   a training step: forward with labels, backward, AdamW
  infer   inference (eval, inference_mode): images per second

HF runs with its default attention (SDPA). Ratios are HF time / tformer time (> 1: tformer is faster).

    python benchmarks/vit_speed.py [--rounds 5] [--steps 3] [--threads N] [--preset vit-mnist]
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
from tformer.config import resolve_config  # noqa: E402

BATCH = 128


def pair(preset: str, folder: Path):
    """HF's ViTForImageClassification at the preset's shape, and tformer's load of the same weights."""
    import transformers
    transformers.logging.set_verbosity_error()
    config = resolve_config(preset)
    torch.manual_seed(0)
    reference = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=config.image_size, patch_size=config.patch_size, num_channels=config.num_channels,
        hidden_size=config.d_model, num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        intermediate_size=config.d_ff, hidden_act="gelu", layer_norm_eps=config.norm_eps,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=config.num_labels,
    ))
    reference.save_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = tformer.load(folder)
    return reference, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--preset", default="vit-mnist")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        train_models = pair(args.preset, Path(folder) / "train")
        infer_models = pair(args.preset, Path(folder) / "infer")
    config = train_models[1].config
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(BATCH, config.num_channels, config.image_size, config.image_size, generator=generator)
    labels = torch.randint(0, config.num_labels, (BATCH,), generator=generator)

    work = {}
    for side, model in zip(("hf", "tformer"), train_models, strict=True):
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def train_step(m=model, o=optimizer) -> None:
            m(pixel_values=pixels, labels=labels).loss.backward()
            o.step()
            o.zero_grad(set_to_none=True)

        work["train", side] = train_step
    for side, model in zip(("hf", "tformer"), infer_models, strict=True):
        model.eval()

        def infer(m=model) -> None:
            with torch.inference_mode():
                m(pixel_values=pixels)

        work["infer", side] = infer
    with torch.inference_mode():
        difference = (infer_models[0](pixel_values=pixels).logits - infer_models[1](pixel_values=pixels).logits)
    difference = difference.abs().max().item()
    print(f"{args.preset}: {config.image_size} x {config.image_size} x {config.num_channels}, "
          f"patch {config.patch_size}, width {config.d_model}, {config.num_layers} layers; batch {BATCH}, float32, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}; same logits to {difference:.1e}")
    times = interleaved(work, args.rounds, args.steps)
    for kind in ("train", "infer"):
        hf, ours = statistics.median(times[kind, "hf"]), statistics.median(times[kind, "tformer"])
        if kind == "infer":
            print(f"{kind:6s} HF {BATCH / hf:7.1f} images/s, tformer {BATCH / ours:7.1f} images/s, "
                  f"ratio {hf / ours:.3f}")
        else:
            print(f"{kind:6s} HF {hf * 1000:7.1f} ms/step, tformer {ours * 1000:7.1f} ms/step, ratio {hf / ours:.3f}")


if __name__ == "__main__":
    main()
