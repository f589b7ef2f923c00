"""Measuring what a computation costs as its size grows: the peak bytes one call allocates, the
power law a cost follows (the slope of a log-log fit), and the size from which one method is the
cheaper of two. The benchmarks that compare attention kernels read their figures through these."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def peak_allocated_bytes(function: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """The most bytes that tensors allocated during ``function()`` held at one time, above what was
    held when it started (what it keeps, such as gradients it writes, counts while it is alive).

    On CUDA: the allocator's peak statistic. On the CPU, where PyTorch keeps no such statistic:
    every allocation and free of PyTorch's CPU allocator recorded by ``torch.profiler`` with
    ``profile_memory=True``, summed in time order. Only tensor storage counts, not Python objects
    or the allocator's cached blocks."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        function()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu":
        raise ValueError(f"peak_allocated_bytes measures 'cpu' or 'cuda' devices, not {device.type!r}")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        function()
    # Allocations carry a positive byte count, frees a negative one ("[memory]" events).
    events = _cpu_memory_events(profiler)
    held = peak = 0
    for _, change in events:
        held += change
        peak = max(peak, held)
    return peak


def _cpu_memory_events(profiler) -> list[tuple[int, int]]:
    """(time ns, bytes: + allocated, - freed) of each CPU allocator event the profiler recorded."""
    events = [(event.start_ns(), event.nbytes()) for event in profiler.profiler.kineto_results.events()
              if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU]
    return sorted(events, key=lambda pair: pair[0])


def loglog_slope(sizes: Sequence[float], values: Sequence[float]) -> float:
    """The exponent ``p`` of ``value ~ size^p``: the least-squares slope of log(value) against log(size).

    Needs at least two distinct sizes and positive values (a cost that is 0 or negative has no log)."""
    if len(sizes) != len(values):
        raise ValueError(f"loglog_slope needs as many values as sizes, got {len(values)} and {len(sizes)}")
    if any(not size > 0 for size in sizes) or any(not value > 0 for value in values):
        raise ValueError("loglog_slope needs positive sizes and values")
    xs = [math.log(size) for size in sizes]
    ys = [math.log(value) for value in values]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError(f"loglog_slope needs at least two distinct sizes, got {list(sizes)}")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def crossover(sizes: Sequence[float], costs: Sequence[float], reference_costs: Sequence[float]) -> float | None:
    """The size from which ``costs`` stay below ``reference_costs`` (both measured at ``sizes``,
    in increasing order): interpolated on log-log axes between the last size where it cost at least
    as much and the next; ``sizes[0]`` when it is cheaper everywhere (the crossover lies at or below
    it); None when it is not cheaper at the largest size."""
    if not len(sizes) == len(costs) == len(reference_costs) or not sizes:
        raise ValueError("crossover needs one cost and one reference cost per size, and at least one size")
    if list(sizes) != sorted(sizes):
        raise ValueError(f"crossover needs increasing sizes, got {list(sizes)}")
    ratios = [math.log(cost / reference) for cost, reference in zip(costs, reference_costs, strict=True)]
    if ratios[-1] >= 0:
        return None
    last_not_cheaper = max((index for index, ratio in enumerate(ratios) if ratio >= 0), default=None)
    if last_not_cheaper is None:
        return float(sizes[0])
    low, high = last_not_cheaper, last_not_cheaper + 1
    fraction = ratios[low] / (ratios[low] - ratios[high])  # where the log-ratio line crosses 0
    return math.exp(math.log(sizes[low]) + fraction * (math.log(sizes[high]) - math.log(sizes[low])))
