"""The acceptance run: ``tformer train configs/shakespeare-char.toml`` (nanoGPT's CPU
shakespeare-char settings), timed from process start to exit, as a user would time it.

For each repeat it reports the whole-run wall time, the time of the training steps alone (from
the run's own tokens/s, which leaves out evaluations and checkpoints), the validation loss at the
last evaluation (20 batches, as nanoGPT's eval_iters=20 measures it), the validation loss of the
final model on *all* of the validation split (non-overlapping 64-character windows: the same
quantity without the sampling noise), the training tokens/s, and the machine's load average
(other processes share its 2 cores).

Peers, each timed as a whole process in the same repeat (the order rotates from repeat to
repeat, as the machine's speed drifts over minutes):

* ``--peer`` (the default): ``plain_gpt_reference.py``, the same settings in a plain PyTorch
  loop in nanoGPT's manner (written here, not nanoGPT's code);
* ``--nanogpt PATH``: the same loop training nanoGPT's own GPT, imported from ``PATH/model.py``
  (a checkout of github.com/karpathy/nanoGPT), with the optimizer its ``configure_optimizers``
  builds. Without ``PATH/model.py`` that row is skipped with a one-line note.

Every run gets the same thread count (``--threads``, default torch's default here): tformer
through ``training.threads`` (so its thread tuner is off), the peers through ``--threads``; the
table shows the count each run reports it used. The peers evaluate as nanoGPT does (both splits,
from iteration 0: 9 x 40 batches) where tformer evaluates its held-out split (8 x 20 batches),
so the training-step time is compared apart from the wall time, which includes each one's own
evaluation work.

    python benchmarks/shakespeare_char.py [--repeat 3] [--threads 2] [--no-peer] [--nanogpt PATH]
                                          [--set training.max_steps=50 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import train_step_overhead as shape  # noqa: E402
from data_roots import data_path  # noqa: E402

import tformer  # noqa: E402
from tformer.data.sources import load_language_model_data  # noqa: E402
from tformer.training.recipe import load_recipe  # noqa: E402

RECIPE = REPO / "configs" / "shakespeare-char.toml"
DATA = data_path("tinyshakespeare/input.txt.gz")
TARGETS = {"wall_s": 83.0, "val_loss": 1.89}


def full_validation_loss(run: Path) -> float:
    """Mean next-character loss of the run's final model over the whole validation split."""
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


def tformer_run(overrides: list[str], threads: int) -> dict:
    """``tformer train`` of the recipe as a whole process, and what it reports it ran."""
    with tempfile.TemporaryDirectory(prefix="shakespeare-char-") as folder:
        run = Path(folder) / "run"
        settings = [*overrides, f"training.threads={threads}"]
        command = [sys.executable, "-m", "tformer", "train", str(RECIPE), "--out", str(run), "--no-progress",
                   *(item for setting in settings for item in ("--set", setting))]
        started = time.perf_counter()
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if result.returncode != 0:
            raise SystemExit(f"training failed:\n{result.stdout}\n{result.stderr}")
        lines = result.stdout.splitlines()
        header = next(line for line in lines if line.startswith("training "))
        summary = next(line for line in lines if line.startswith("completed at step"))
        used = re.search(r" with (\d+) threads?\b", header)
        steps = int(re.match(r"completed at step (\d+)", summary).group(1))
        tokens_per_s = float(summary.rsplit(" s, ", 1)[1].split()[0].replace(",", ""))
        recipe = load_recipe(run / "recipe.toml")
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        evaluated = [r for r in records if r.get("eval_loss") is not None]
        tokens_per_step = recipe.training.batch_size * recipe.training.seq_len * recipe.training.grad_accum_steps
        return {
            "threads": int(used.group(1)) if used else None, "wall_s": wall, "steps": steps,
            "train_s": steps * tokens_per_step / tokens_per_s, "tokens_per_s": tokens_per_s,
            "val_loss": evaluated[-1]["eval_loss"], "full_val_loss": full_validation_loss(run),
            "evaluations": f"{len(evaluated)} x {recipe.training.eval_batches}",
        }


def peer_run(steps: int, threads: int, nanogpt: Path | None) -> dict:
    """``plain_gpt_reference.py`` (with nanoGPT's GPT when ``nanogpt``) as a whole process, and
    what it reports it ran."""
    command = [sys.executable, str(REPO / "benchmarks" / "plain_gpt_reference.py"), "--no-full-validation", "--json",
               "--steps", str(steps), "--threads", str(threads)]
    if nanogpt is not None:
        command += ["--nanogpt", str(nanogpt)]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"the peer failed ({' '.join(command[1:])}):\n{result.stdout}\n{result.stderr}")
    figures = json.loads(result.stdout.splitlines()[-1])
    return {
        "threads": figures["threads"], "wall_s": wall, "steps": figures["steps"], "train_s": figures["train_seconds"],
        "tokens_per_s": figures["tokens_per_s"], "val_loss": figures["val_loss"], "full_val_loss": None,
        "evaluations": f"{figures['evaluations']} x {figures['eval_batches']}",
    }


def check_peer_shape(overrides: list[str]) -> int:
    """The recipe's max_steps, after checking that the peers train the recipe's shape."""
    recipe = load_recipe(RECIPE, overrides)
    model, training = recipe.model, recipe.training
    ours = (model.max_seq_len, model.d_model, model.num_layers, model.num_heads, training.batch_size,
            training.seq_len, training.grad_accum_steps)
    theirs = (shape.CONTEXT, shape.WIDTH, shape.LAYERS, shape.HEADS, shape.BATCH, shape.CONTEXT, 1)
    if ours != theirs:
        raise SystemExit(f"the peers train the recipe's own shape (context, width, layers, heads, batch, seq_len, "
                         f"accumulation) {theirs}; these --set values make it {ours}: drop them or pass --no-peer")
    return training.max_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help=f"CPU threads for every run (default here: {torch.get_num_threads()})")
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the plain nanoGPT-manner loop in each repeat (default: on)")
    parser.add_argument("--nanogpt", type=Path, default=None, metavar="PATH",
                        help="also time nanoGPT's own GPT (PATH/model.py of a nanoGPT checkout) in the same loop")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    if args.repeat < 1 or args.threads < 1:
        parser.error(f"--repeat and --threads must be at least 1 (got {args.repeat}, {args.threads})")
    if any(item.split("=", 1)[0].strip() == "training.threads" for item in args.overrides):
        parser.error("--set training.threads: use --threads, which every run gets")
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is absent: this benchmark needs tinyshakespeare (tformer data fetch tinyshakespeare)")
    if args.nanogpt is not None and not (args.nanogpt / "model.py").is_file():
        print(f"--nanogpt {args.nanogpt}: no model.py there (not a nanoGPT checkout); skipping the nanoGPT row")
        args.nanogpt = None
    runners = {"tformer": lambda: tformer_run(args.overrides, args.threads)}
    if args.peer or args.nanogpt is not None:
        steps = check_peer_shape(args.overrides)
        if args.peer:
            runners["plain loop"] = lambda: peer_run(steps, args.threads, None)
        if args.nanogpt is not None:
            runners["nanoGPT's GPT"] = lambda: peer_run(steps, args.threads, args.nanogpt)
    names = list(runners)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    print(f"{args.threads} threads asked for every run; {len(names)} runs per repeat, in rotating order")
    print(f"{'repeat':>6} {'run':<14} {'threads':>7} {'steps':>6} {'wall s':>7} {'train s':>8} {'ms/step':>8} "
          f"{'rest s':>7} {'tokens/s':>9} {'val loss':>9} {'full val':>9} {'evals x batches':>16}  load avg")
    for repeat in range(args.repeat):
        order = names[repeat % len(names):] + names[: repeat % len(names)]
        for name in order:
            load_before = os.getloadavg()[0]
            r = runners[name]()
            runs[name].append(r)
            full = "-" if r["full_val_loss"] is None else f"{r['full_val_loss']:.4f}"
            print(f"{repeat + 1:>6} {name:<14} {r['threads'] or '?':>7} {r['steps']:>6} {r['wall_s']:>7.1f} "
                  f"{r['train_s']:>8.1f} {r['train_s'] / r['steps'] * 1000:>8.1f} {r['wall_s'] - r['train_s']:>7.1f} "
                  f"{r['tokens_per_s']:>9,.0f} {r['val_loss']:>9.4f} {full:>9} {r['evaluations']:>16}  "
                  f"{load_before:.2f} -> {os.getloadavg()[0]:.2f}", flush=True)
    print("\ntrain s: the training steps alone (tformer: from its own tokens/s; the peers time each step); "
          "rest s: start-up, data, evaluations, checkpoints")
    ours = runs["tformer"]
    print(f"tformer (median of {len(ours)}): wall {statistics.median(r['wall_s'] for r in ours):.1f} s "
          f"(target <= {TARGETS['wall_s']:.0f}), last val loss {statistics.median(r['val_loss'] for r in ours):.4f} "
          f"(target <= {TARGETS['val_loss']}), full-validation loss "
          f"{statistics.median(r['full_val_loss'] for r in ours):.4f}")
    for name in names[1:]:
        step_ratio = statistics.median(t["train_s"] / t["steps"] / (p["train_s"] / p["steps"])
                                       for t, p in zip(ours, runs[name], strict=True))
        wall_ratio = statistics.median(t["wall_s"] / p["wall_s"] for t, p in zip(ours, runs[name], strict=True))
        print(f"tformer / {name}, same repeat (median): training-step time {step_ratio:.2f}, wall {wall_ratio:.2f} "
              f"(wall includes each one's own evaluations: {ours[-1]['evaluations']} against "
              f"{runs[name][-1]['evaluations']} batches)")


if __name__ == "__main__":
    main()
