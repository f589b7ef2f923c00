"""The translation claim on Multi30k German -> English: the 2017 transformer translates better than the
attention RNN and trains in less wall time, with the same data, the same joint BPE and the same batches.

    python benchmarks/translation_multi30k.py train transformer   # configs/multi30k-de-en-transformer.toml
    python benchmarks/translation_multi30k.py train rnn           # configs/multi30k-de-en-rnn.toml
    python benchmarks/translation_multi30k.py evaluate transformer rnn
    python benchmarks/translation_multi30k.py report

``train`` runs ``tformer train`` on the recipe into runs/multi30k-de-en-<model> and records the wall time
of the whole command (the BPE learned, the data read, every step and evaluation). ``evaluate`` translates
test_2016_flickr with beam 5 and greedily (``tformer evaluate RUN --source --reference``: sacreBLEU, 13a,
cased, detokenized, signature printed). Figures go to runs/multi30k-results.json; ``report`` prints the
table. Run one thing at a time: the figures are times on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
RESULTS = ROOT / "runs" / "multi30k-results.json"
TFORMER = [sys.executable, "-m", "tformer"]


def recipe(model: str) -> Path:
    return ROOT / "configs" / f"multi30k-de-en-{model}.toml"


def run_folder(model: str) -> Path:
    return ROOT / "runs" / f"multi30k-de-en-{model}"


def load_results() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}


def save_results(results: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def train(model: str) -> None:
    command = [*TFORMER, "train", str(recipe(model)), "--out", str(run_folder(model)), "--no-progress"]
    print("$", " ".join(command[2:]), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - started
    results = load_results()
    results.setdefault(model, {})["train_seconds"] = seconds
    save_results(results)
    print(f"{model}: trained in {seconds / 60:.1f} minutes")


def evaluate(model: str) -> None:
    results = load_results()
    for beam in (5, 1):
        out = run_folder(model) / "evaluation" / f"beam{beam}"
        command = [*TFORMER, "evaluate", str(run_folder(model)), "--source", str(DATA / "test_2016_flickr.de.gz"),
                   "--reference", str(DATA / "test_2016_flickr.en.gz"), "--beam", str(beam), "--out", str(out)]
        print("$", " ".join(command[2:]), flush=True)
        subprocess.run(command, check=True)
        record = json.loads((out / "test_2016_flickr.json").read_text())
        results.setdefault(model, {})[f"beam{beam}"] = {key: record[key] for key in (
            "bleu", "chrf", "bleu_signature", "seconds", "sentences")}
    save_results(results)


def report() -> None:
    results = load_results()
    print(f"{'model':<12} {'train min':>9} {'BLEU beam 5':>11} {'BLEU greedy':>11} {'chrF beam 5':>11}")
    for model, figures in results.items():
        minutes = figures.get("train_seconds", float("nan")) / 60
        beam5, greedy = figures.get("beam5", {}), figures.get("beam1", {})
        print(f"{model:<12} {minutes:>9.1f} {beam5.get('bleu', float('nan')):>11.2f} "
              f"{greedy.get('bleu', float('nan')):>11.2f} {beam5.get('chrf', float('nan')):>11.2f}")
    signature = next((figures["beam5"]["bleu_signature"] for figures in results.values() if "beam5" in figures), None)
    if signature:
        print(f"sacreBLEU {signature}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["train", "evaluate", "report"])
    parser.add_argument("models", nargs="*", choices=["transformer", "rnn"], default=[])
    args = parser.parse_args()
    if args.stage == "report":
        report()
        return
    for model in args.models or ["transformer", "rnn"]:
        (train if args.stage == "train" else evaluate)(model)
    report()


if __name__ == "__main__":
    main()
