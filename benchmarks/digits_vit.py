"""A Vision Transformer on scikit-learn's bundled 8 x 8 digits (1,797 images; nothing to download), trained
from scratch through a recipe, as ``tformer train`` would, in about a minute on a CPU.

The digits (pixel values 0..16, scaled to 0..255) are written as two ``.npz`` files, the form the
``image_classification`` task reads: the first 1,437 images to train on, the last 360 held out. The recipe
is the ``vit-mnist`` preset shrunk to 8 x 8 images cut into four 4 x 4 patches; it prints the held-out accuracy
at the last step, the training time and the run folder (``tformer classify RUN IMAGE.png`` labels images).

    python benchmarks/digits_vit.py [--steps 400] [--out runs/digits-vit]

Measured here (2 cores shared with other jobs, load average 4): 92.2% held-out accuracy at step 400, 75 s of
training (24 s of CPU time). On these images a translation by one pixel is an eighth of the image: random
crops slowed learning (with 2 x 2 patches: 70% after 500 steps with them, 89% after 300 without), so the
recipe has none; 4 x 4 patches learn as well as 2 x 2 (92% either way) at a quarter of the tokens.

Needs scikit-learn (``pip install scikit-learn``); without it the script says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from tformer.training.recipe import recipe_from_dict  # noqa: E402
from tformer.training.run import train_recipe  # noqa: E402

HELD_OUT = 360


def write_digits(folder: Path) -> tuple[Path, Path]:
    """train.npz and test.npz of the digits (uint8 images (N, 8, 8), labels, label names "0".."9")."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)  # (1797, 8, 8), 0..16 -> 0..255
    labels = digits.target.astype(np.int64)
    names = np.array([str(digit) for digit in range(10)])
    folder.mkdir(parents=True, exist_ok=True)
    train, test = folder / "train.npz", folder / "test.npz"
    np.savez(train, images=images[:-HELD_OUT], labels=labels[:-HELD_OUT], label_names=names)
    np.savez(test, images=images[-HELD_OUT:], labels=labels[-HELD_OUT:], label_names=names)
    return train, test


def recipe(train: Path, test: Path, steps: int) -> dict:
    return {
        "model": {"preset": "vit-mnist", "image_size": 8, "patch_size": 4, "d_model": 64, "num_layers": 4,
                  "num_heads": 4},
        "data": {"train": str(train), "eval": str(test)},
        "task": {"name": "image_classification"},  # no augmentation: a pixel is an eighth of these images
        "training": {"max_steps": steps, "batch_size": 64, "lr": 2e-3, "min_lr": 1e-5, "warmup_steps": steps // 10,
                     "weight_decay": 0.05, "beta2": 0.999, "eval_every": max(1, steps // 5), "eval_batches": 0,
                     "early_stopping_metric": "eval_accuracy", "checkpoint_every": 0, "keep_last": 1, "seed": 1337},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="training steps (default: 400, 18 passes)")
    parser.add_argument("--out", default="runs/digits-vit", help="run folder (default: runs/digits-vit)")
    args = parser.parse_args()
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("digits_vit: scikit-learn is not installed (pip install scikit-learn): it holds the digits",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    train, test = write_digits(out.parent / f"{out.name}-data")
    started = time.perf_counter()
    result = train_recipe(recipe_from_dict(recipe(train, test, args.steps)), out, progress=False)
    seconds = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [record for record in records if "eval_accuracy" in record][-1]
    print(f"\ndigits ViT: held-out accuracy {last['eval_accuracy']:.4f} at step {last['step']} "
          f"({HELD_OUT} images), {seconds:.0f} s in all, {result.throughput:,.0f} images/s; run folder {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
