"""Interleaved timing for the speed benchmarks: every measurement runs once per round, round after
round, so a noisy neighbour slows both sides of a comparison alike; report the medians."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


def timed(function: Callable[[], object], steps: int) -> float:
    """Seconds per call, over ``steps`` calls."""
    started = time.perf_counter()
    for _ in range(steps):
        function()
    return (time.perf_counter() - started) / steps


def interleaved(work: dict[Hashable, Callable[[], object]], rounds: int, steps: int,
                warm_up: bool = True) -> dict[Hashable, list[float]]:
    """Each function's seconds per call in every round (``steps`` calls a round), after one warm-up call each
    (``warm_up``; leave it off for calls so long that their first one is no outlier); a line per round as it
    ends."""
    times: dict[Hashable, list[float]] = {key: [] for key in work}
    if warm_up:
        for function in work.values():
            function()
    for round_index in range(rounds):
        for key, function in work.items():
            times[key].append(timed(function, steps))
        print(f"round {round_index + 1}: " + ", ".join(f"{'/'.join(map(str, key)) if isinstance(key, tuple) else key} "
                                                      f"{_duration(seconds[-1])}" for key, seconds in times.items()),
              flush=True)
    return times


def rotating(rounds: int, work: dict[Hashable, Callable[[], object]]) -> dict[Hashable, list]:
    """Every call of ``work`` once a round, ``rounds`` rounds, the order rotating by one each round (so that the
    host's drift falls on every measurement alike): each key's results, one a round."""
    keys = list(work)
    results: dict[Hashable, list] = {key: [] for key in keys}
    for index in range(rounds):
        for key in keys[index % len(keys):] + keys[: index % len(keys)]:
            results[key].append(work[key]())
    return results


def _duration(seconds: float) -> str:
    """Milliseconds under 10 s, else seconds."""
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def memory_read_bandwidth() -> float:
    """GB/s of a float32 sum over 1 GiB, the best of five: what a decoding step, which reads every weight once,
    cannot beat. On a shared host it moves with the neighbours' load (30-53 GB/s on the 2-core AMD EPYC one)."""
    import torch

    values = torch.ones(1 << 28)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        values.sum()
        best = min(best, time.perf_counter() - started)
    return values.numel() * 4 / best / 1e9
