"""Quantized weights beside float32 on the workloads that multiply many rows at once: beam-5 translation
and encoder classification (batch-1 decoding is ``generate_speed.py --part quantized``).

  translate  beam-5 translation of test_2016_flickr's first --sentences German sentences, 64 at a time, by a
             random model of the Multi30k recipe's shape (3 + 3 layers, width 256, 8,000-token joint BPE learned
             from its training pairs): tformer float32, int8, w8a8 and int4 (groups of 64); sentences/s. Random
             weights never end a sentence early, so every beam runs to the length budget.
  classify   bert-mini sequence classification inference (batch 32, 128 tokens, 4 x 256, random weights):
             Hugging Face BertForSequenceClassification float32 beside tformer float32, int8, w8a8 and int4 on the
             same weights; ms per batch.

Every column runs once a round in the order given, --rounds rounds, medians reported; ratios are against
tformer float32 and (classify) Hugging Face float32. Each quantized layer multiplies as the host's measured
plan says (``tformer.nn.weights.quantized``), printed first.

    python benchmarks/quantized_speed.py [--workloads translate,classify] [--rounds 3] [--sentences 256]
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_path  # noqa: E402

import tformer  # noqa: E402
from benchmarks.compare_trees import translation_folder  # noqa: E402
from benchmarks.encoder_speed import batch  # noqa: E402
from tformer.generation.translation import translate  # noqa: E402
from tformer.nn.weights import QUANTIZED_BACKENDS  # noqa: E402
from tformer.nn.weights.quantized import plan_for  # noqa: E402

DATA = data_path("multi30k")
METHODS = ("int8", "w8a8", "int4")


def medians_by_round(work: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Every function once a round (after one warm-up call each); the median seconds of each."""
    for function in work.values():
        function()
    seconds: dict[str, list[float]] = {name: [] for name in work}
    for round_index in range(rounds):
        for name, function in work.items():
            started = time.perf_counter()
            function()
            seconds[name].append(time.perf_counter() - started)
        times = ", ".join(f"{name} {values[-1]:.2f} s" for name, values in seconds.items())
        print(f"  round {round_index + 1}: {times}", flush=True)
    return {name: statistics.median(values) for name, values in seconds.items()}


def translate_workload(work: Path, rounds: int, count: int) -> None:
    folder = translation_folder(work)
    with gzip.open(DATA / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as file:
        sentences = file.read().splitlines()[:count]
    models = {"fp32": tformer.load(folder).eval()}
    models.update({method: tformer.load(folder, quantize=method).eval() for method in METHODS})
    outputs = {}

    def run(name):
        outputs[name] = translate(models[name], sentences, num_beams=5, batch_size=64).texts

    seconds = medians_by_round({name: (lambda name=name: run(name)) for name in models}, rounds)
    speed = {name: len(sentences) / value for name, value in seconds.items()}
    same = {method: sum(a == b for a, b in zip(outputs[method], outputs["fp32"], strict=True)) for method in METHODS}
    print(f"== translate, beam 5, {len(sentences)} sentences: " + ", ".join(
        f"{name} {value:.1f} sentences/s" for name, value in speed.items()) + "; " + ", ".join(
        f"{method}/fp32 {speed[method] / speed['fp32']:.2f}x ({same[method]} of {len(sentences)} translations "
        "the same as fp32's)" for method in METHODS), flush=True)


def classify_workload(rounds: int) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024)
    reference = transformers.BertForSequenceClassification(config).eval()
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference.save_pretrained(folder)
        models = {"fp32": tformer.load(folder).eval()}
        models.update({method: tformer.load(folder, quantize=method).eval() for method in METHODS})
    inputs = batch(False, torch.Generator().manual_seed(0))
    logits = {}

    def run(model, name):
        with torch.inference_mode():
            logits[name] = model(**inputs).logits

    work = {"HF fp32": lambda: [run(reference, "HF fp32") for _ in range(3)]}
    work.update({name: (lambda model=model, name=name: [run(model, name) for _ in range(3)]) for name, model in
                 models.items()})
    seconds = {name: value / 3 for name, value in medians_by_round(work, rounds).items()}
    errors = {method: ((logits[method] - logits["fp32"]).norm() / logits["fp32"].norm()).item() for method in METHODS}
    print("== classify, bert-mini, batch 32 x 128: " + ", ".join(
        f"{name} {value * 1000:.1f} ms" for name, value in seconds.items()) + "; " + ", ".join(
        f"{method}/HF fp32 {seconds['HF fp32'] / seconds[method]:.2f}x, {method}/fp32 "
        f"{seconds['fp32'] / seconds[method]:.2f}x (logits within {errors[method]:.1%} of fp32's)"
        for method in METHODS), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="translate,classify", help="of translate, classify")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=256, help="translate: sentences of test_2016_flickr")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's default)")
    parser.add_argument("--work", type=Path, default=Path("runs/compare-trees"), help="the translation model's folder")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    workloads = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = sorted(set(workloads) - {"translate", "classify"})
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; known: translate, classify")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    print("plans on this host (measured): " + "; ".join(
        f"{name}: {plan_for(backend).describe()}" for name, backend in QUANTIZED_BACKENDS.items()), flush=True)
    for workload in workloads:
        if workload == "translate":
            translate_workload(args.work.resolve(), args.rounds, args.sentences)
        else:
            classify_workload(args.rounds)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
