"""The quantization quality report: trained runs evaluated in float32, int8, w8a8 and int4 side by side, with
the size of their weights on disk and the memory a process holds once the model is loaded.

    python benchmarks/quantization.py runs/shakespeare-char [RUN ...] [--methods int8,w8a8,int4] [--group-size 64]
    python benchmarks/quantization.py --sizes-only FOLDER [FOLDER ...]    # any model folder: sizes and memory

Each RUN is a finished run folder (``tformer train``): it is evaluated on its own recipe's evaluation split
exactly as training evaluated it, over the whole split (``tformer evaluate``'s code path), once per scheme
(the float model, then ``tformer.load(RUN, quantize=...)``). A translation run is also scored on a test
set with beam search (``--translation-test``, default Multi30k's test_2016_flickr, German to English, beam
``--beam`` 5; BLEU and chrF by sacrebleu, as ``tformer evaluate --source/--reference`` scores them).
Size: the model.safetensors of the folder ``tformer quantize`` would write. Memory: the resident set of
a fresh process after ``tformer.load``, less that of the same process before the load (torch imported),
the median of three processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_path  # noqa: E402

import tformer  # noqa: E402
from tformer.cli.evaluate import run_recipe  # noqa: E402
from tformer.quantization import scheme_for  # noqa: E402
from tformer.training.tasks import task_for_recipe  # noqa: E402
from tformer.training.trainer import Trainer  # noqa: E402

MULTI30K = data_path("multi30k")
MEMORY_PROBE = """
import json, sys, warnings
import torch
import tformer
def resident():
    return int(next(line for line in open('/proc/self/status') if line.startswith('VmRSS')).split()[1]) * 1024
before = resident()
with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    model = tformer.load(sys.argv[1]).eval()
print(json.dumps(resident() - before))
"""


def evaluate(folder: Path, scheme, threads: int | None = None) -> dict[str, float]:
    """The run's evaluation metrics over its whole evaluation split, with the model quantized as ``scheme``
    (on ``threads`` CPU threads; default: the recipe's)."""
    recipe = run_recipe(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tformer.load(folder, quantize=scheme)
    label_names = tuple(model.config.label_names) or None
    tokenizer = getattr(model, "tokenizer", None)
    data = dataclasses.replace(recipe.data, tokenizer="char")  # none named: the model's own tokenizer reads it
    task, _ = task_for_recipe(recipe.task, data, seq_len=recipe.training.seq_len, tokenizer=tokenizer,
                              label_names=label_names)
    training = dataclasses.replace(recipe.training, eval_batches=0, compile=False, device="cpu",
                                   threads=threads or recipe.training.threads)
    return Trainer(model, training, task, out_dir=None, progress=False).evaluate_metrics() or {}


def translation_test(folder: Path, scheme, source: Path, reference: Path, beam: int) -> dict[str, float]:
    """BLEU and chrF of the run's translations of ``source`` (beam search) against ``reference``."""
    from tformer.data.parallel import read_aligned
    from tformer.evaluation.translation import translation_scores
    from tformer.generation.translation import translate

    sources, references = read_aligned(str(source), str(reference), what="sentence")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tformer.load(folder, quantize=scheme).eval()
    texts = translate(model, sources, num_beams=beam, batch_size=64).texts
    scores = translation_scores(texts, references)
    return {f"test_bleu_beam{beam}": scores.bleu, f"test_chrf_beam{beam}": scores.chrf}


def weights_on_disk(folder: Path, scheme) -> int:
    if scheme is None:
        return (folder / "model.safetensors").stat().st_size
    with tempfile.TemporaryDirectory() as temporary, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tformer.load(folder, quantize=scheme).save(Path(temporary) / "model")
        return (Path(temporary) / "model" / "model.safetensors").stat().st_size


def resident_memory(folder: Path, scheme) -> int:
    """Bytes a fresh process holds for the loaded model (median of three processes)."""
    with tempfile.TemporaryDirectory() as temporary:
        target = folder
        if scheme is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tformer.load(folder, quantize=scheme).save(Path(temporary) / "model")
            target = Path(temporary) / "model"
        values = [json.loads(subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(target)], capture_output=True,
                                            text=True, check=True).stdout) for _ in range(3)]
    return int(statistics.median(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders (model folders with --sizes-only)")
    parser.add_argument("--sizes-only", action="store_true", help="no evaluation: sizes and memory of model folders")
    parser.add_argument("--methods", default="int8,w8a8,int4")
    parser.add_argument("--group-size", type=int, default=64, help="int4 inputs per group (default: 64)")
    parser.add_argument("--translation-test", nargs=2, type=Path, metavar=("SOURCE", "REFERENCE"),
                        default=[MULTI30K / "test_2016_flickr.de.gz", MULTI30K / "test_2016_flickr.en.gz"],
                        help="translation runs: the test set scored with beam search (default: Multi30k "
                             "test_2016_flickr, de -> en)")
    parser.add_argument("--beam", type=int, default=5, help="translation runs: beams for the test set (default: 5)")
    parser.add_argument("--threads", type=int, help="CPU threads for the evaluations (default: each recipe's)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    schemes = {"fp32": None}
    for method in args.methods.split(","):
        schemes[method] = scheme_for(method, args.group_size if method == "int4" else None)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    if not args.sizes_only:
        for run in args.runs:
            try:
                run_recipe(run)
            except FileNotFoundError as error:
                parser.error(f"{run}: not a finished run folder ({error.strerror}); --sizes-only for model folders")
    report = {}
    for run in args.runs:
        rows = {}
        for name, scheme in schemes.items():
            metrics = {} if args.sizes_only else evaluate(run, scheme, args.threads)
            if not args.sizes_only and run_recipe(run).task.name == "translation":
                metrics.update(translation_test(run, scheme, *args.translation_test, args.beam))
            rows[name] = {"metrics": metrics, "disk_bytes": weights_on_disk(run, scheme),
                          "resident_bytes": resident_memory(run, scheme)}
            shown = "".join(f"{key} {value:.4f}, " for key, value in metrics.items())
            print(f"{run} {name:>5}: {shown}weights on disk {rows[name]['disk_bytes'] / 1e6:.2f} MB "
                  f"({rows[name]['disk_bytes'] / rows['fp32']['disk_bytes']:.2f}x fp32); resident "
                  f"{rows[name]['resident_bytes'] / 1e6:.1f} MB", flush=True)
        for name in schemes:
            if name == "fp32" or args.sizes_only:
                continue
            changes = ", ".join(
                f"{key} {value - rows['fp32']['metrics'][key]:+.4f} ({(value / rows['fp32']['metrics'][key] - 1):+.2%})"
                for key, value in rows[name]["metrics"].items() if rows["fp32"]["metrics"].get(key))
            print(f"{run} {name:>5} against fp32: {changes}")
        report[str(run)] = rows
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
