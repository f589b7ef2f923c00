"""The CPU threads a command that runs a model computes with when the user names none: PyTorch's count, or fewer
where fewer are faster on this machine now.

On a machine that other processes share, PyTorch's OpenMP threads spin-wait for a partner the scheduler has put
aside, and a small model's decoding step can run 5-10x slower on two threads than on one (``tformer generate``
on a busy 2-core host: 9.6-19.8 tokens/s on two threads, 112.9 on one). Training measures as it runs
(``training/threads.py``); the inference commands ask ``choose_threads`` once, as the model loads:

- the measurement: a decoding-sized step (one row through two prepacked layers as wide as the model, the
  layout decoding reads on the CPU) timed on 1 thread and on PyTorch's count; PyTorch's count is kept when it
  is at least 10% faster. Done once per machine and model width class and kept in a small JSON file under the
  user's cache folder (``$XDG_CACHE_HOME/tformer/threads.json``, written whole or not at all); a measurement
  taken while the machine is busy is used for that run but not kept.
- the load: every run reads the load average; when other work leaves fewer free cores than the chosen count,
  the command computes with the free ones (at least 1) and says so in one line.

An explicit count (``--threads N``, or ``OMP_NUM_THREADS`` in the environment) is never changed.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch import nn

from tformer.files import write_text_atomically
from tformer.nn.weights import PrepackedLinear
from tformer.nn.weights.backend import decoding_step

MARGIN = 0.9  # more threads are kept when a step on them takes at most this share of a step on one
SMALLEST_CLASS, LARGEST_CLASS = 32, 1024  # width classes: powers of two; wider models are measured at 1024
WARMUP_STEPS, TIMED_STEPS = 3, 9
CACHE_VERSION = 1


@dataclass(frozen=True)
class ThreadChoice:
    """The threads to compute with, and a line saying why (None when there is nothing new to say)."""

    threads: int
    note: str | None = None


def cache_file() -> Path:
    """Where measured choices are kept: ``$XDG_CACHE_HOME/tformer/threads.json``, else ``~/.cache/...``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "tformer" / "threads.json"


def width_class(width: int) -> int:
    """The class a model of width ``width`` (d_model) is measured in: the power of two at or below it, within
    [SMALLEST_CLASS, LARGEST_CLASS]."""
    power = 1 << max(int(width), 1).bit_length() - 1
    return min(max(power, SMALLEST_CLASS), LARGEST_CLASS)


def load_average() -> float | None:
    """The system's load average over the last minute, or None where the system gives none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def step_seconds(threads: int, width: int) -> float:
    """The median time of a decoding-sized step on ``threads`` threads: one row through a ``width`` ->
    4 x ``width`` -> ``width`` pair of prepacked layers (the thread count PyTorch had is restored)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(0)  # not the global generator: a command's sampling stays as seeded
        layers = []
        for size_in, size_out in ((width, 4 * width), (4 * width, width)):
            linear = nn.utils.skip_init(nn.Linear, size_in, size_out)
            with torch.no_grad():
                linear.weight.normal_(0, size_in ** -0.5, generator=generator)
                linear.bias.zero_()
            layers.append(PrepackedLinear.from_linear(linear))
        x = torch.randn(1, width, generator=generator)
        times = []
        with torch.no_grad(), decoding_step:
            for step in range(WARMUP_STEPS + TIMED_STEPS):
                started = time.perf_counter()
                h = torch.nn.functional.layer_norm(x, (width,))
                x = x + layers[1](torch.nn.functional.gelu(layers[0](h)))
                if step >= WARMUP_STEPS:
                    times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        torch.set_num_threads(before)


def choose_threads(width: int, *, default: int | None = None, cpus: int | None = None,
                   measure: Callable[[int, int], float] | None = None, load: Callable[[], float | None] | None = None,
                   path: Path | None = None) -> ThreadChoice:
    """The threads to run a model of width ``width`` with: ``default`` (PyTorch's count) or 1, as measured on
    this machine (``measure(threads, width)`` gives a step's seconds; kept in ``path``, default
    ``cache_file()``), then no more than the cores the load average ``load()`` leaves free of ``cpus``
    (default: the CPUs this process may run on). ``measure`` and ``load`` default to ``step_seconds`` and
    ``load_average``."""
    if default is None:
        default = torch.get_num_threads()
    cpus = available_cpus() if cpus is None else cpus
    if default < 2:
        return ThreadChoice(default)
    path = cache_file() if path is None else path
    size = width_class(width)
    key = f"{platform.node()}|{cpus} cpus|{default} threads|width {size}"
    choices = _read_choices(path)
    busy_load = (load or load_average)()
    free = None if busy_load is None else max(1, int(cpus - busy_load + 0.5))  # the cores other work leaves
    note = None
    kept = choices.get(key, {}).get("threads")
    if isinstance(kept, int) and 1 <= kept <= default:
        threads = kept
    else:
        def keep(entry: dict) -> bool:
            return _write_choices(path, {**choices, key: entry})

        threads, note = _measure(size, default, measure or step_seconds, free, keep, path)
    if free is not None and threads > free:
        note = (f"the machine is busy (load average {busy_load:.1f} on {cpus} CPUs): computing with {free} "
                f"thread{'s' if free > 1 else ''}, not {threads}, since more would wait for each other "
                f"(--threads N to choose)")
        threads = free
    return ThreadChoice(threads, note)


def _measure(size: int, default: int, measure: Callable[[int, int], float], free: int | None,
             keep: Callable[[dict], bool], path: Path) -> tuple[int, str]:
    """Time a step of width ``size`` on 1 and on ``default`` threads; the faster count (``default`` by at least
    1 - MARGIN) and a line saying so. ``keep(entry)`` stores it unless the machine is busy (fewer than ``default``
    cores free)."""
    one, many = measure(1, size), measure(default, size)
    threads = default if many <= MARGIN * one else 1
    if free is not None and free < default:
        kept = "not kept: measured while the machine is busy"
    elif keep({"threads": threads, "step_ms": {"1": round(one * 1e3, 3), str(default): round(many * 1e3, 3)},
               "measured": datetime.now(UTC).isoformat(timespec="seconds")}):
        kept = f"kept in {path}"
    else:
        kept = f"not kept: {path} cannot be written"
    return threads, (f"{threads} CPU thread{'s' if threads > 1 else ''} for models about {size} wide on this "
                     f"machine (a decoding-sized step: {one * 1e3:.2f} ms on 1 thread, {many * 1e3:.2f} ms on "
                     f"{default}; {kept}; --threads N to choose)")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system tells it; else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on macOS and Windows
        return os.cpu_count() or 1


def _read_choices(path: Path) -> dict:
    """The kept choices, by key; an absent, unreadable or foreign file reads as none (it is rewritten)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("choices"), dict):
        return {}
    return {key: value for key, value in data["choices"].items() if isinstance(value, dict)}


def _write_choices(path: Path, choices: dict) -> bool:
    """Keep ``choices`` in ``path`` (whole or not at all); False when the folder cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps({"version": CACHE_VERSION, "choices": choices}, indent=1) + "\n")
    except OSError:
        return False
    return True
