"""The recipes whose figures the docs quote, trained over several seeds: the mean, the range and the
training time of each, on this machine's CPU, beside the figure a recipe promises where it promises one.

Each (recipe, seed) trains into RUNS/NAME/seed-S through the command line (`tformer train ... --resume
auto`), so an interrupted sweep continues where it stopped and a finished run is only read again. The
fine-tuning recipes (sst2, wnut17, squad) start from bert-mini-mlm's run of the same seed. Scores:
the run's last evaluation in metrics.jsonl (the recipe's own evaluation data: MNIST's and Fashion-MNIST's
test sets, SST-2 dev, WNUT-17 test, SQuAD's held-out articles), or for translation a beam-5 `tformer
evaluate` of test_2016_flickr (sacreBLEU). Time: the run's training seconds (its newest checkpoint's
``elapsed_seconds``, resumes included), and its steps: a recipe sized by the clock (mnist-vit,
fashion-mnist-vit: training.max_steps = 0 with max_minutes) trains as many steps as its budget holds on the
host, so the table gives each row's minutes, steps, threads and hosts beside its figures.

The encoder chain is the one docs/encoders.md reports (benchmarks/pretraining_helps.py): bert-mini-mlm
pretrains on that script's corpus of every allowed English text, read through its own WordPiece
vocabulary (built once into RUNS/pretraining-corpus), with the script's settings for its 2,400 steps (the
half-hour limit left out: a seed's minutes are reported instead); sst2, wnut17 and squad fine-tune it;
their -scratch twins train the same recipe, architecture and tokenizer from random weights.

    python benchmarks/recipes.py --seeds 3                       # every recipe, seeds 1, 2, 3 (hours)
    python benchmarks/recipes.py --seeds 3 mnist-vit fashion-mnist-vit
    python benchmarks/recipes.py --seeds 1 --max-steps 20 mnist-vit --runs /tmp/smoke   # the pipeline only
    python benchmarks/recipes.py --seeds 1 --max-minutes 0.5 mnist-vit --runs /tmp/smoke  # a clock-sized one

A sweep of hours can span sessions and fresh clones through a ledger (`--ledger FILE`, JSON lines, one
record per finished recipe and seed: its score, minutes, steps, host, threads, date and commit): a seed the ledger holds
for the same recipe (the config file's bytes, and the recipe it starts from) is read from it, not trained
again; a seed trained here is added to it. Without `--ledger` every seed is this machine's own.

    python benchmarks/recipes.py --seeds 3 --seed 2 --threads 1 multi30k-transformer \
        --ledger benchmarks/logs/recipes-ledger.jsonl    # one seed (another process runs seed 1)

Prints a Markdown table (and writes RUNS/recipes.json); the docs quote its rows.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import platform
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from data_roots import data_file
from pretraining_helps import PRETRAIN_SETTINGS, from_scratch

from tformer.training.recipe import recipe_from_dict, toml_value

ROOT = Path(__file__).resolve().parents[1]
CORPUS = "pretraining-corpus"  # RUNS/CORPUS: benchmarks/pretraining_helps.py's corpus.txt and tokenizer.json


@dataclass(frozen=True)
class RecipeRun:
    """A recipe of configs/, the score the docs quote for it and, where one is promised, its threshold."""

    config: str
    metric: str  # a key of metrics.jsonl, or "bleu" (a beam-5 test evaluation)
    scale: float = 1.0  # 100 for a fraction quoted in percent
    higher_is_better: bool = True
    threshold: float | None = None  # every seed must reach it (on the quoted scale)
    init_from: str | None = None  # the recipe whose same-seed run it fine-tunes
    scratch_of: str | None = None  # the recipe whose same-seed run's architecture it trains from random weights
    settings: tuple[str, ...] = ()  # --set overrides; "{corpus}" is RUNS/CORPUS
    decimals: int = 2  # as the docs quote it: 2 for percentages, BLEU and SQuAD's F1; 4 for losses and 0-1 F1
    run_of: str | None = None  # another figure of that recipe's run (a multi-task run's other sources)
    data_script: str | None = None  # a script of benchmarks/ that builds the recipe's data into data/ first

    @property
    def reads_corpus(self) -> bool:
        return any("{corpus}" in setting for setting in self.settings)


# the pretraining of docs/encoders.md: its script's settings for 2,400 steps, without the half-hour limit
PRETRAINING = tuple(setting for setting in PRETRAIN_SETTINGS if not setting.startswith("training.max_minutes")) + (
    "data.train={corpus}/corpus.txt", "data.tokenizer={corpus}/tokenizer.json")

T5_TEST_BLEU = "multi30k_test_bleu"  # a beam-4 `tformer evaluate --data multi30k=test_2016_flickr` (lowercased)

RECIPES = {
    "shakespeare-char": RecipeRun("shakespeare-char.toml", "eval_loss", higher_is_better=False, decimals=4),
    "mnist-vit": RecipeRun("mnist-vit.toml", "eval_accuracy", 100.0, threshold=99.0),
    "fashion-mnist-vit": RecipeRun("fashion-mnist-vit.toml", "eval_accuracy", 100.0, threshold=90.0),
    "multi30k-transformer": RecipeRun("multi30k-de-en-transformer.toml", "bleu"),
    "multi30k-rnn": RecipeRun("multi30k-de-en-rnn.toml", "bleu"),
    "bert-mini-mlm": RecipeRun("bert-mini-mlm.toml", "eval_loss", higher_is_better=False, settings=PRETRAINING,
                               decimals=4),
    "sst2": RecipeRun("sst2.toml", "eval_accuracy", 100.0, init_from="bert-mini-mlm"),
    "sst2-scratch": RecipeRun("sst2.toml", "eval_accuracy", 100.0, scratch_of="bert-mini-mlm"),
    "sst2-lora": RecipeRun("sst2-lora.toml", "eval_accuracy", 100.0, init_from="bert-mini-mlm"),
    "wnut17": RecipeRun("wnut17.toml", "eval_f1", init_from="bert-mini-mlm", decimals=4),
    "wnut17-scratch": RecipeRun("wnut17.toml", "eval_f1", scratch_of="bert-mini-mlm", decimals=4),
    "squad": RecipeRun("squad.toml", "eval_f1", init_from="bert-mini-mlm"),
    "squad-scratch": RecipeRun("squad.toml", "eval_f1", scratch_of="bert-mini-mlm"),
    # T5's chain (docs/t5.md): span corruption on data/t5-corpus, then the text-to-text mixture, whose one run per
    # seed gives three figures: SST-2 dev accuracy, Multi30k test_2016 BLEU (beam 4, lowercased), SQuAD F1
    "t5-span-pretrain": RecipeRun("t5-span-pretrain.toml", "eval_loss", higher_is_better=False, decimals=4,
                                  data_script="t5_corpus.py"),
    "t5-multitask-sst2": RecipeRun("t5-multitask.toml", "eval_sst2_accuracy", 100.0, init_from="t5-span-pretrain"),
    "t5-multitask-multi30k": RecipeRun("t5-multitask.toml", T5_TEST_BLEU, run_of="t5-multitask-sst2"),
    "t5-multitask-squad": RecipeRun("t5-multitask.toml", "eval_squad_f1", run_of="t5-multitask-sst2"),
    "t5-multitask-sst2-scratch": RecipeRun("t5-multitask.toml", "eval_sst2_accuracy", 100.0,
                                           scratch_of="t5-span-pretrain"),
    "t5-multitask-multi30k-scratch": RecipeRun("t5-multitask.toml", T5_TEST_BLEU, run_of="t5-multitask-sst2-scratch"),
    "t5-multitask-squad-scratch": RecipeRun("t5-multitask.toml", "eval_squad_f1", run_of="t5-multitask-sst2-scratch"),
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


def config_bytes(path: Path) -> bytes:
    """A config file's bytes as the ledger keys them: with its datasets by name spelled as the shared-data paths
    they replaced (``dataset:NAME/`` as ``../../shared/data/NAME/``, without the ``root`` line), so that naming
    the same, checksum-verified files another way (issue 61) keeps the records measured on them."""
    text = path.read_text(encoding="utf-8")
    text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("root = "))
    return text.replace('"dataset:', '"../../shared/data/').encode("utf-8")


def recipe_key(name: str, max_steps: int | None, max_minutes: float | None = None) -> str:
    """What a ledger record was measured on: the config file's bytes, the step or time cut and, for a
    fine-tuning recipe, the key of the recipe it starts from."""
    recipe = RECIPES[name]
    digest = hashlib.sha256(config_bytes(ROOT / "configs" / recipe.config))
    if recipe.reads_corpus or recipe.data_script:  # the scripts that build the corpus and its vocabulary
        digest.update((ROOT / "benchmarks" / "pretraining_helps.py").read_bytes())
    if recipe.data_script:
        digest.update((ROOT / "benchmarks" / recipe.data_script).read_bytes())
    if recipe.run_of:
        digest.update(f"|run_of={recipe_key(recipe.run_of, max_steps, max_minutes)}".encode())
    start = recipe.init_from or recipe.scratch_of
    cut = f"|max_steps={max_steps}" + ("" if max_minutes is None else f"|max_minutes={max_minutes}")
    digest.update(f"{cut}|settings={recipe.settings}|scratch={recipe.scratch_of is not None}"
                  f"|start={start and recipe_key(start, max_steps, max_minutes)}".encode())
    return digest.hexdigest()[:16]


def read_ledger(path: Path | None) -> dict[tuple[str, int, str], dict]:
    """The ledger's records by (recipe, seed, key); a later record of the same triple wins."""
    if path is None or not path.is_file():
        return {}
    records = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            records[(record["recipe"], int(record["seed"]), record["key"])] = record
        except (ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"{path}:{number}: not a ledger record ({error})") from None
    return records


def git_commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def prepare_corpus(runs: Path) -> None:
    """Build the pretraining corpus and its WordPiece vocabulary into RUNS/CORPUS once (a minute)."""
    folder = runs / CORPUS
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{CORPUS}.log", "a", encoding="utf-8") as log:
        fcntl.flock(log, fcntl.LOCK_EX)  # another process's sweep may be building it
        if (folder / "tokenizer.json").is_file():
            return
        result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pretraining_helps.py"), "tokenizer",
                                 "--out", str(folder)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"building {folder} failed; see {folder.parent / f'{CORPUS}.log'}")


def build_data(script: str) -> None:
    """Run a data-building script of benchmarks/ once (it writes into data/; its log beside what it builds)."""
    folder = ROOT / "data"
    folder.mkdir(exist_ok=True)
    with open(folder / f"{Path(script).stem}.log", "a", encoding="utf-8") as log:
        fcntl.flock(log, fcntl.LOCK_EX)  # another process's sweep may be building it
        if (folder / Path(script).stem.replace("_", "-") / "tokenizer.json").is_file():
            return
        result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script)], stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"benchmarks/{script} failed; see {folder / f'{Path(script).stem}.log'}")


def scratch_recipe(config: Path, pretrained_run: Path, out: Path) -> Path:
    """Write the from-scratch twin of a fine-tuning recipe to OUT, its data paths made absolute. Only the
    settings the twin names are written: a resolved recipe would also fix what the training data decides
    (num_labels: its default of 2 against WNUT-17's 13 tags)."""
    raw = tomllib.loads(config.read_text(encoding="utf-8"))
    from_scratch(raw, pretrained_run)
    resolved = recipe_from_dict(raw, source=str(config), base_dir=config.parent)  # checked, paths resolved
    for key in ("train", "eval", "tokenizer", "sources"):
        if raw["data"].get(key):
            raw["data"][key] = getattr(resolved.data, key)
    lines = []
    for section, values in raw.items():
        lines += [f"[{section}]", *(f"{key} = {toml_value(value)}" for key, value in values.items()), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def train(name: str, seed: int, runs: Path, threads: int, max_steps: int | None,
          max_minutes: float | None = None) -> Path:
    """Train (or finish, or only read) one seed of one recipe, and first the run it starts from; its
    output goes to RUN.log."""
    recipe = RECIPES[name]
    if recipe.run_of is not None:
        return train(recipe.run_of, seed, runs, threads, max_steps, max_minutes)
    start = recipe.init_from or recipe.scratch_of
    if start is not None:
        train(start, seed, runs, threads, max_steps, max_minutes)
    if recipe.reads_corpus:
        prepare_corpus(runs)
    if recipe.data_script:
        build_data(recipe.data_script)
    out = run_folder(runs, name, seed)
    config = ROOT / "configs" / recipe.config
    if recipe.scratch_of is not None:
        config = scratch_recipe(config, run_folder(runs, recipe.scratch_of, seed), out.parent / f"seed-{seed}.toml")
    command = [sys.executable, "-m", "tformer", "train", str(config), "--out", str(out),
               "--resume", "auto", "--no-progress"]
    for setting in recipe.settings:
        command += ["--set", setting.format(corpus=runs / CORPUS)]
    command += ["--set", f"training.seed={seed}", "--set", f"training.threads={threads}"]
    if max_steps is not None:
        command += ["--set", f"training.max_steps={max_steps}", "--set", f"training.eval_every={max_steps}"]
    if max_minutes is not None:
        command += ["--set", f"training.max_minutes={max_minutes}"]
    if recipe.init_from is not None:
        command += ["--set", f"model.init_from={run_folder(runs, recipe.init_from, seed)}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"seed-{seed}.log", "a", encoding="utf-8") as log:
        fcntl.flock(log, fcntl.LOCK_EX)  # two sweeps starting from one run: the second waits, then finds it done
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
    if recipe.metric == T5_TEST_BLEU:
        return text_to_text_bleu(run)
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
        corpus = data_file("multi30k")
        subprocess.run([sys.executable, "-m", "tformer", "evaluate", str(run), "--source",
                        str(corpus / "test_2016_flickr.de.gz"), "--reference", str(corpus / "test_2016_flickr.en.gz"),
                        "--beam", "5", "--out", str(out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        record_file = next(path for path in out.glob("*.json") if "bleu" in json.loads(path.read_text()))
    return float(json.loads(record_file.read_text())["bleu"])


def text_to_text_bleu(run: Path) -> float:
    """sacreBLEU (lowercased, as the recipe scores it) of a beam-4 test_2016_flickr translation by a text-to-text
    run's final model, through its multi30k source (evaluated once)."""
    out = run / "evaluation-recipes"
    record_file = out / "multi30k-test_2016_flickr.beam4.json"
    if not record_file.is_file():
        subprocess.run([sys.executable, "-m", "tformer", "evaluate", str(run), "--data",
                        f"multi30k={data_file('multi30k/test_2016_flickr')}", "--beam", "4", "--out", str(out)],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return float(json.loads(record_file.read_text())["eval_multi30k_bleu"])


def training_length(run: Path) -> tuple[float, int | None]:
    """Training minutes (resumes included) and steps of a run, from its newest checkpoint's trainer state."""
    states = sorted((run / "checkpoints").glob("step-*/trainer_state.json"))
    if not states:
        return float("nan"), None
    state = json.loads(states[-1].read_text())
    return state["elapsed_seconds"] / 60, state["step"]


def summary(name: str, records: list[dict]) -> dict:
    recipe = RECIPES[name]
    values = [record["value"] for record in records]
    minutes = [record["minutes"] for record in records]
    worst = min(values) if recipe.higher_is_better else max(values)
    holds = None if recipe.threshold is None else all(value >= recipe.threshold for value in values)
    steps = [record["steps"] for record in records if record.get("steps") is not None]  # older records lack them
    return {"recipe": name, "metric": recipe.metric, "values": values, "mean": statistics.fmean(values),
            "min": min(values), "max": max(values), "worst": worst, "threshold": recipe.threshold,
            "every_seed_holds": holds, "minutes_mean": statistics.fmean(minutes), "minutes_max": max(minutes),
            "steps_min": min(steps, default=None), "steps_max": max(steps, default=None),
            "threads": sorted({record["threads"] for record in records}),
            "hosts": sorted({record["host"] for record in records}),
            "seeds": [record["seed"] for record in records], "records": records}


def shown(value: float, name: str, sign: str = "") -> str:
    """A score (or with sign="+" a difference) of recipe NAME as the docs quote it."""
    return f"{value:{sign}.{RECIPES[name].decimals}f}"


def step_range(row: dict) -> str:
    """The steps of a row's seeds (blank where its records predate them)."""
    low, high = row["steps_min"], row["steps_max"]
    if low is None:
        return ""
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def table(rows: list[dict]) -> str:
    """The Markdown table: each recipe's figures with the minutes, steps, threads and hosts they came from."""
    lines = ["| recipe | metric | seeds | mean | range | threshold | every seed holds | training minutes (mean, max) "
             "| steps | threads | host |", "|---|---|---|---:|---|---:|---|---|---|---|---|"]
    for row in rows:
        threshold = "" if row["threshold"] is None else f"{row['threshold']:g}"
        holds = "" if row["every_seed_holds"] is None else ("yes" if row["every_seed_holds"] else "**no**")
        name = row["recipe"]
        values = ", ".join(shown(value, name) for value in row["values"])
        lines.append(f"| {name} | {row['metric']} | {values} | {shown(row['mean'], name)} | "
                     f"{shown(row['min'], name)}-{shown(row['max'], name)} | {threshold} | {holds} | "
                     f"{row['minutes_mean']:.1f}, {row['minutes_max']:.1f} | {step_range(row)} | "
                     f"{', '.join(str(threads) for threads in row['threads'])} | {'; '.join(row['hosts'])} |")
    return "\n".join(lines)


def pairs(rows: list[dict]) -> list[dict]:
    """Each fine-tuning recipe beside its -scratch twin, seed by seed: what pretraining adds (positive when
    the pretrained start scores better, whichever way the metric points)."""
    by_name = {row["recipe"]: row for row in rows}
    compared = []
    for name, row in by_name.items():
        twin = by_name.get(f"{name}-scratch")
        if twin is None:
            continue
        sign = 1.0 if RECIPES[name].higher_is_better else -1.0
        scratch = {record["seed"]: record["value"] for record in twin["records"]}
        gains = {record["seed"]: sign * (record["value"] - scratch[record["seed"]])
                 for record in row["records"] if record["seed"] in scratch}
        if gains:
            values = list(gains.values())
            compared.append({"recipe": name, "metric": row["metric"], "seeds": list(gains), "gains": values,
                             "mean": statistics.fmean(values), "min": min(values), "max": max(values),
                             "every_seed_gains": all(value > 0 for value in values)})
    return compared


def pair_table(compared: list[dict]) -> str:
    lines = ["| recipe | metric | pretrained - scratch, by seed | mean | range | pretraining helps on every seed |",
             "|---|---|---|---:|---|---|"]
    for pair in compared:
        name = pair["recipe"]
        by_seed = zip(pair["seeds"], pair["gains"], strict=True)
        gains = ", ".join(f"{seed}: {shown(gain, name, '+')}" for seed, gain in by_seed)
        helps = "yes" if pair["every_seed_gains"] else "**no**"
        lines.append(f"| {name} | {pair['metric']} | {gains} | {shown(pair['mean'], name, '+')} | "
                     f"{shown(pair['min'], name, '+')} to {shown(pair['max'], name, '+')} | {helps} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"recipes (default: all): {', '.join(RECIPES)}")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 1..N (default: 3)")
    parser.add_argument("--seed", type=int, action="append", dest="only_seeds", metavar="S",
                        help="only this seed of 1..N (repeatable): split a sweep over processes")
    parser.add_argument("--ledger", type=Path, help="JSON-lines record of finished seeds, read and extended")
    parser.add_argument("--report", action="store_true",
                        help="train nothing: the table of what the ledger holds, and the seeds it lacks")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "recipes", help="where the runs go")
    parser.add_argument("--threads", type=int, default=2, help="training threads (default: 2)")
    parser.add_argument("--max-steps", type=int, help="cut every run to this many steps (a smoke test)")
    parser.add_argument("--max-minutes", type=float,
                        help="give every run this time budget (a smoke test of a recipe sized by the clock)")
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in RECIPES]
    if unknown or args.seeds < 1:
        parser.error(f"unknown recipe {unknown[0]!r} (choose from {', '.join(RECIPES)})" if unknown
                     else "--seeds must be at least 1")
    seeds = sorted(set(args.only_seeds or range(1, args.seeds + 1)))
    if not 1 <= seeds[0] <= seeds[-1] <= args.seeds:
        parser.error(f"--seed must be between 1 and --seeds ({args.seeds})")
    if args.report and args.ledger is None:
        parser.error("--report reads the ledger: name it with --ledger FILE")
    names = [name for name in RECIPES if name in (args.names or RECIPES)]
    ledger = read_ledger(args.ledger)
    started = time.time()
    rows, lacking = [], []
    for name in names:
        key = recipe_key(name, args.max_steps, args.max_minutes)
        records = []
        for seed in seeds:
            record = ledger.get((name, seed, key))
            if record is None and args.report:
                lacking.append(f"{name} seed {seed}")
                continue
            if record is None:
                run = train(name, seed, args.runs, args.threads, args.max_steps, args.max_minutes)
                minutes, steps = training_length(run)
                record = {"recipe": name, "seed": seed, "key": key, "value": score(name, run),
                          "minutes": minutes, "steps": steps, "host": cpu_name(), "threads": args.threads,
                          "date": time.strftime("%Y-%m-%d"), "commit": git_commit()}
                if args.ledger is not None:
                    args.ledger.parent.mkdir(parents=True, exist_ok=True)
                    with open(args.ledger, "a", encoding="utf-8") as out:
                        out.write(json.dumps(record) + "\n")
            steps = "" if record.get("steps") is None else f", {record['steps']:,} steps"
            print(f"{name} seed {seed}: {RECIPES[name].metric} {record['value']:.4f}, {record['minutes']:.1f} min"
                  f"{steps} ({record['host']}, threads {record['threads']}, {record['date']})", flush=True)
            records.append(record)
        if records:
            rows.append(summary(name, records))
    hosts = sorted({record["host"] for row in rows for record in row["records"]})
    host = f"{'; '.join(hosts) or cpu_name()}; python {platform.python_version()}"
    print(f"\n{host}; {time.strftime('%Y-%m-%d')}; {(time.time() - started) / 60:.1f} min for this call\n")
    print(table(rows))
    compared = pairs(rows)
    if compared:
        print(f"\n{pair_table(compared)}")
    if lacking:
        print(f"\nnot in the ledger (for these configs): {', '.join(lacking)}")
    args.runs.mkdir(parents=True, exist_ok=True)
    (args.runs / "recipes.json").write_text(json.dumps({"host": host, "date": time.strftime("%Y-%m-%d"),
                                                        "max_steps": args.max_steps,
                                                        "max_minutes": args.max_minutes, "rows": rows,
                                                        "pretrained_minus_scratch": compared}, indent=2) + "\n")


if __name__ == "__main__":
    main()
