"""The recipes whose figures the docs quote, trained over several seeds: the mean, the range and the
training time of each, on this machine's CPU, beside the figure a recipe promises where it promises one.

Each (recipe, seed) trains into RUNS/NAME/seed-S through the command line (`tformer train ... --resume
auto`), so an interrupted sweep continues where it stopped and a finished run is only read again. The
fine-tuning recipes (sst2, wnut17, squad) start from bert-mini-mlm's run of the same seed. Scores:
the run's last evaluation in metrics.jsonl (the recipe's own evaluation data: MNIST's and Fashion-MNIST's
test sets, SST-2 dev, WNUT-17 test, SQuAD's held-out articles), or for translation a beam-5 `tformer
evaluate` of test_2016_flickr (sacreBLEU). Time: the run's training seconds (its newest checkpoint's
``elapsed_seconds``, resumes included).

    python benchmarks/recipes.py --seeds 3                       # every recipe, seeds 1, 2, 3 (hours)
    python benchmarks/recipes.py --seeds 3 mnist-vit fashion-mnist-vit
    python benchmarks/recipes.py --seeds 1 --max-steps 20 mnist-vit --runs /tmp/smoke   # the pipeline only

Prints a Markdown table (and writes RUNS/recipes.json); the docs quote its rows.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


@dataclass(frozen=True)
class RecipeRun:
    """A recipe of configs/, the score the docs quote for it and, where one is promised, its threshold."""

    config: str
    metric: str  # a key of metrics.jsonl, or "bleu" (a beam-5 test evaluation)
    scale: float = 1.0  # 100 for a fraction quoted in percent
    higher_is_better: bool = True
    threshold: float | None = None  # every seed must reach it (on the quoted scale)
    init_from: str | None = None  # the recipe whose same-seed run it fine-tunes


RECIPES = {
    "shakespeare-char": RecipeRun("shakespeare-char.toml", "eval_loss", higher_is_better=False),
    "mnist-vit": RecipeRun("mnist-vit.toml", "eval_accuracy", 100.0, threshold=99.0),
    "fashion-mnist-vit": RecipeRun("fashion-mnist-vit.toml", "eval_accuracy", 100.0, threshold=90.0),
    "multi30k-transformer": RecipeRun("multi30k-de-en-transformer.toml", "bleu"),
    "multi30k-rnn": RecipeRun("multi30k-de-en-rnn.toml", "bleu"),
    "bert-mini-mlm": RecipeRun("bert-mini-mlm.toml", "eval_accuracy", 100.0),
    "sst2": RecipeRun("sst2.toml", "eval_accuracy", 100.0, init_from="bert-mini-mlm"),
    "wnut17": RecipeRun("wnut17.toml", "eval_f1", init_from="bert-mini-mlm"),
    "squad": RecipeRun("squad.toml", "eval_f1", init_from="bert-mini-mlm"),
}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_folder(runs: Path, name: str, seed: int) -> Path:
    return runs / name / f"seed-{seed}"


def train(name: str, seed: int, runs: Path, threads: int, max_steps: int | None) -> Path:
    """Train (or finish, or only read) one seed of one recipe; its output goes to RUN.log."""
    recipe = RECIPES[name]
    out = run_folder(runs, name, seed)
    command = [sys.executable, "-m", "tformer", "train", str(ROOT / "configs" / recipe.config), "--out", str(out),
               "--resume", "auto", "--no-progress", "--set", f"training.seed={seed}",
               "--set", f"training.threads={threads}"]
    if max_steps is not None:
        command += ["--set", f"training.max_steps={max_steps}", "--set", f"training.eval_every={max_steps}"]
    if recipe.init_from is not None:
        command += ["--set", f"model.init_from={run_folder(runs, recipe.init_from, seed)}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"seed-{seed}.log", "a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"{name} seed {seed}: tformer train exited {result.returncode}; see "
                         f"{out.parent / f'seed-{seed}.log'}")
    return out


def score(name: str, run: Path) -> float:
    """The recipe's quoted score of a finished run, on the quoted scale."""
    recipe = RECIPES[name]
    if recipe.metric == "bleu":
        return translation_bleu(run)
    values = [record[recipe.metric] for record in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if recipe.metric in record]
    if not values:
        raise SystemExit(f"{run}/metrics.jsonl has no {recipe.metric}")
    return values[-1] * recipe.scale


def translation_bleu(run: Path) -> float:
    """sacreBLEU of a beam-5 translation of test_2016_flickr by the run's final model (evaluated once)."""
    out = run / "evaluation-recipes"
    record_file = out / "test_2016_flickr.json"
    if not record_file.is_file():
        corpus = DATA / "multi30k"
        subprocess.run([sys.executable, "-m", "tformer", "evaluate", str(run), "--source",
                        str(corpus / "test_2016_flickr.de.gz"), "--reference", str(corpus / "test_2016_flickr.en.gz"),
                        "--beam", "5", "--out", str(out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        record_file = next(path for path in out.glob("*.json") if "bleu" in json.loads(path.read_text()))
    return float(json.loads(record_file.read_text())["bleu"])


def training_minutes(run: Path) -> float:
    """Training time of a run (resumes included), from its newest checkpoint's trainer state."""
    states = sorted((run / "checkpoints").glob("step-*/trainer_state.json"))
    if not states:
        return float("nan")
    return json.loads(states[-1].read_text())["elapsed_seconds"] / 60


def summary(name: str, values: list[float], minutes: list[float]) -> dict:
    recipe = RECIPES[name]
    worst = min(values) if recipe.higher_is_better else max(values)
    holds = None if recipe.threshold is None else all(value >= recipe.threshold for value in values)
    return {"recipe": name, "metric": recipe.metric, "values": values, "mean": statistics.fmean(values),
            "min": min(values), "max": max(values), "worst": worst, "threshold": recipe.threshold,
            "every_seed_holds": holds, "minutes_mean": statistics.fmean(minutes), "minutes_max": max(minutes)}


def shown(value: float) -> str:
    """A score as the docs quote it: four decimals below 10 (losses, F1 in 0..1), two above (percent, BLEU)."""
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.2f}"


def table(rows: list[dict]) -> str:
    lines = ["| recipe | metric | seeds | mean | range | threshold | every seed holds | training minutes (mean, max) |",
             "|---|---|---|---:|---|---:|---|---|"]
    for row in rows:
        threshold = "" if row["threshold"] is None else f"{row['threshold']:g}"
        holds = "" if row["every_seed_holds"] is None else ("yes" if row["every_seed_holds"] else "**no**")
        lines.append(f"| {row['recipe']} | {row['metric']} | {', '.join(map(shown, row['values']))} | "
                     f"{shown(row['mean'])} | {shown(row['min'])}-{shown(row['max'])} | {threshold} | {holds} | "
                     f"{row['minutes_mean']:.1f}, {row['minutes_max']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"recipes (default: all): {', '.join(RECIPES)}")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 1..N (default: 3)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "recipes", help="where the runs go")
    parser.add_argument("--threads", type=int, default=2, help="training threads (default: 2)")
    parser.add_argument("--max-steps", type=int, help="cut every run to this many steps (a smoke test)")
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in RECIPES]
    if unknown or args.seeds < 1:
        parser.error(f"unknown recipe {unknown[0]!r} (choose from {', '.join(RECIPES)})" if unknown
                     else "--seeds must be at least 1")
    names = args.names or list(RECIPES)
    wanted = set(names) | {RECIPES[name].init_from for name in names if RECIPES[name].init_from}
    order = [name for name in RECIPES if name in wanted]  # pretraining before what fine-tunes it
    started = time.time()
    rows = []
    for name in order:
        values, minutes = [], []
        for seed in range(1, args.seeds + 1):
            run = train(name, seed, args.runs, args.threads, args.max_steps)
            values.append(score(name, run))
            minutes.append(training_minutes(run))
            print(f"{name} seed {seed}: {RECIPES[name].metric} {values[-1]:.4f}, {minutes[-1]:.1f} min", flush=True)
        if name in names:
            rows.append(summary(name, values, minutes))
    host = f"{cpu_name()}, {args.threads} threads, python {platform.python_version()}"
    print(f"\n{host}; {time.strftime('%Y-%m-%d')}; {(time.time() - started) / 60:.1f} min for this call\n")
    print(table(rows))
    args.runs.mkdir(parents=True, exist_ok=True)
    (args.runs / "recipes.json").write_text(json.dumps({"host": host, "date": time.strftime("%Y-%m-%d"),
                                                        "max_steps": args.max_steps, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
