"""Refusing, before allocating, what cannot fit in memory: a model built from a config, the caches
of a long generation. One estimate against one reading of the memory available, so the error
names both instead of the process being ended by the kernel's out-of-memory killer."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tformer.errors import TformerError


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes that can still be allocated on ``device``: free CUDA memory plus what PyTorch holds
    unused, or on the CPU the kernel's MemAvailable bounded by the cgroup's limit. None when
    it cannot be read (then nothing is refused)."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        return free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    if device.type != "cpu":
        return None
    readings = [_meminfo_available(), _cgroup_headroom()]
    known = [value for value in readings if value is not None]
    return min(known) if known else None


def require_memory(
    needed: int, device: torch.device | str, what: str, error: type[TformerError] = TformerError
) -> int | None:
    """Raise ``error`` naming ``what``, the estimate and the memory available, when ``needed``
    bytes do not fit on ``device``; else return the bytes available (None: unknown)."""
    available = available_memory(device)
    if available is not None and needed > available:
        raise error(f"{what} needs about {format_bytes(needed)} of memory; "
                    f"{format_bytes(available)} is available on {torch.device(device).type}")
    return available


def peak_memory(device: torch.device | str = "cpu") -> int | None:
    """The most memory this process has held so far, in bytes: on CUDA the most PyTorch allocated on the device
    (``max_memory_allocated``), on the CPU the process's peak resident set (``getrusage``'s ru_maxrss). None where
    neither can be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def format_bytes(count: float) -> str:
    """``count`` bytes in the largest binary unit that keeps the number >= 1, e.g. ``2.4 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom() -> int | None:
    """The cgroup v2 memory limit minus its current use (a container's own limit), or None."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()), 0)
    except (OSError, ValueError):
        return None
