"""What training runs cost, read from their folders: the parameters each trained (an adapter run's
adapter_model.safetensors, else the model's parameters), its peak memory (the largest ``peak_memory_mib`` in
metrics.jsonl: RSS on the CPU, max allocated on CUDA) and its median seconds per step (the units of a step, from
the run's log line ``training N steps of U units``, over each step's ``units_per_s``). A run's log is
``RUN.log`` beside its folder, as benchmarks/recipes.py and gsm8k_sft.py write them, or ``--log`` files in order.

    python benchmarks/run_costs.py runs/recipes/sst2/seed-1 runs/recipes/sst2-lora/seed-1
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer  # noqa: E402

STEP_LINE = re.compile(r"^training +[\d,]+ steps of ([\d,]+) (\w+)", re.MULTILINE)


def records(run: Path) -> list[dict]:
    """The run's metrics.jsonl records, in order."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]


def peak_memory_mib(run: Path) -> float:
    """The largest peak memory the run's records give."""
    peaks = [record["peak_memory_mib"] for record in records(run) if "peak_memory_mib" in record]
    if not peaks:
        raise SystemExit(f"{run}/metrics.jsonl has no peak_memory_mib")
    return max(peaks)


def seconds_per_step(run: Path, log: Path) -> float:
    """The median step's seconds: the units of a step (the log's last training line) over each step's rate."""
    found = STEP_LINE.findall(log.read_text(encoding="utf-8"))
    if not found:
        raise SystemExit(f"{log}: no 'training N steps of U units' line")
    units, unit = found[-1]
    rates = [record[f"{unit}_per_s"] for record in records(run) if record.get(f"{unit}_per_s")]
    if not rates:
        raise SystemExit(f"{run}/metrics.jsonl has no {unit}_per_s")
    return statistics.median(int(units.replace(",", "")) / rate for rate in rates)


def trained_parameters(run: Path) -> int:
    """The parameters the run trained: its adapter file's tensors (the adapters and any head trained whole), or
    every parameter of its model."""
    adapter = run / "adapter_model.safetensors"
    if adapter.is_file():
        with safe_open(str(adapter), "pt") as tensors:
            return sum(math.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    return tformer.load(run).num_parameters()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders")
    parser.add_argument("--log", type=Path, nargs="*", help="each run's log, in order (default: RUN.log)")
    args = parser.parse_args()
    logs = args.log or [run.with_suffix(".log") for run in args.runs]
    if len(logs) != len(args.runs):
        parser.error(f"{len(logs)} logs for {len(args.runs)} runs")
    print("| run | trained parameters | peak MiB | seconds per step |")
    print("|---|---:|---:|---:|")
    for run, log in zip(args.runs, logs, strict=True):
        print(f"| {run} | {trained_parameters(run):,} | {peak_memory_mib(run):,.0f} | "
              f"{seconds_per_step(run, log):.3f} |")


if __name__ == "__main__":
    main()
