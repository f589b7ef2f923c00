"""The acceptance run: ``tformer train configs/shakespeare-char.toml`` (nanoGPT's CPU
shakespeare-char settings), timed from process start to exit, as a user would time it.

For each repeat it reports the whole-run wall time, the validation loss at the last
evaluation (20 random batches, as nanoGPT's eval_iters=20 measures it), the validation loss of
the final model on *all* of the validation split (non-overlapping 64-character windows: the
same quantity without the sampling noise), the training tokens/s, and the machine's load
average (other processes share its 2 cores). nanoGPT's figures beside them are the ones
measured on this machine for the tracker issue (104 s, val loss 1.886, about 16,100 tokens/s).

With ``--peer`` (the default) each repeat also times, as a whole process right after it,
``plain_gpt_reference.py``: the same settings in a plain PyTorch loop in nanoGPT's manner
(written here, not nanoGPT's code, with nanoGPT's evaluations and checkpoints). The machine's
speed drifts over minutes, so the wall-time ratio to this peer, measured alternately, is the
steadier figure to set beside the issue's 0.8x.

    python benchmarks/shakespeare_char.py [--repeat 3] [--no-peer] [--set training.threads=1 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "shakespeare-char.toml"
DATA = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt.gz"
NANOGPT = {"wall_s": 104.0, "val_loss": 1.886, "tokens_per_s": 16_100}
TARGETS = {"wall_s": 83.0, "val_loss": 1.89}


def full_validation_loss(run: Path) -> float:
    """Mean next-character loss of the run's final model over the whole validation split."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO))
    import tformer
    from tformer.data.sources import load_language_model_data
    from tformer.training.recipe import load_recipe

    recipe = load_recipe(run / "recipe.toml")
    data = load_language_model_data(recipe.data)
    model = tformer.load(run)
    length = recipe.training.seq_len
    tokens = data.eval
    usable = (tokens.numel() - 1) // length * length
    inputs = tokens[:usable].view(-1, length)
    targets = tokens[1 : usable + 1].view(-1, length)
    total, count = 0.0, 0
    with torch.no_grad():
        for first in range(0, inputs.shape[0], 256):
            logits = model(inputs[first : first + 256]).logits
            total += F.cross_entropy(logits.flatten(0, 1), targets[first : first + 256].flatten(),
                                     reduction="sum").item()
            count += targets[first : first + 256].numel()
    return total / count


def one_run(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="shakespeare-char-") as folder:
        run = Path(folder) / "run"
        command = [sys.executable, "-m", "tformer", "train", str(RECIPE), "--out", str(run), "--no-progress", *extra]
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if result.returncode != 0:
            raise SystemExit(f"training failed:\n{result.stdout}\n{result.stderr}")
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        evaluated = [r for r in records if r.get("eval_loss") is not None]
        summary = [line for line in result.stdout.splitlines() if line.startswith("completed at step")]
        tokens_per_s = float(summary[-1].rsplit(" s, ", 1)[1].split()[0].replace(",", ""))
        return {
            "wall_s": wall, "val_loss": evaluated[-1]["eval_loss"], "full_val_loss": full_validation_loss(run),
            "tokens_per_s": tokens_per_s, "steps": records[-1]["step"],
            "load": (load_before, os.getloadavg()[0]),
        }


def peer_run() -> float:
    """Whole-process wall seconds of the plain nanoGPT-manner loop on the same settings."""
    command = [sys.executable, str(REPO / "benchmarks" / "plain_gpt_reference.py"), "--no-full-validation"]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"the plain reference failed:\n{result.stdout}\n{result.stderr}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the plain nanoGPT-manner loop after each run (default: on)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is absent: this benchmark needs ../shared/data/tinyshakespeare beside the project")
    extra = [item for override in args.overrides for item in ("--set", override)]
    runs = []
    peer = " peer wall s  ratio" if args.peer else ""
    print(f"{'run':>4} {'wall s':>8} {'val loss':>9} {'full val':>9} {'tokens/s':>9} {'steps':>6}{peer}  load avg")
    for index in range(args.repeat):
        runs.append(one_run(extra))
        r = runs[-1]
        if args.peer:
            r["peer_wall_s"] = peer_run()
            r["ratio"] = r["wall_s"] / r["peer_wall_s"]
            peer = f" {r['peer_wall_s']:>11.1f} {r['ratio']:>6.2f}"
        print(f"{index + 1:>4} {r['wall_s']:>8.1f} {r['val_loss']:>9.4f} {r['full_val_loss']:>9.4f} "
              f"{r['tokens_per_s']:>9,.0f} {r['steps']:>6}{peer}  {r['load'][0]:.2f} -> {os.getloadavg()[0]:.2f}",
              flush=True)
    median = {key: statistics.median(r[key] for r in runs) for key in ("wall_s", "val_loss", "full_val_loss",
                                                                        "tokens_per_s")}
    print()
    print(f"{'':<22} {'wall s':>8} {'val loss':>9} {'tokens/s':>9}")
    for name, row in (("tformer (median)", median), ("nanoGPT (issue)", NANOGPT)):
        print(f"{name:<22} {row['wall_s']:>8.1f} {row['val_loss']:>9.4f} {row['tokens_per_s']:>9,.0f}")
    print(f"{'target':<22} {'<= ' + str(TARGETS['wall_s']):>8} {'<= ' + str(TARGETS['val_loss']):>9}")
    print(f"full-validation loss (median): {median['full_val_loss']:.4f}")
    if args.peer:
        print(f"wall time / plain nanoGPT-manner loop's, same repeat (median): "
              f"{statistics.median(r['ratio'] for r in runs):.2f} (target 0.80); peer wall (median) "
              f"{statistics.median(r['peer_wall_s'] for r in runs):.1f} s")


if __name__ == "__main__":
    main()
