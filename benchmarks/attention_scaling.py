"""What each attention kernel costs as the sequence grows: forward + backward time and peak memory of
one causal self-attention call (B=1, --heads heads of size 64, float32, CPU) at lengths 256, 512, ...
up to --max-length (16k), for every kernel this checkout has:

  sdpa            torch.nn.functional.scaled_dot_product_attention (PyTorch's fused CPU kernel)
  reference       tformer.nn.attention.attention_reference: scores, softmax, weighted sum
  chunked         tformer.nn.attention.chunked_attention (exact, online softmax over blocks)
  performer       tformer.nn.favor.performer_attention, random_features(256, 64)
  sliding_window  chunked_attention(..., window=256): each query sees itself and the 256 before it

A kernel not importable here is listed as "not available on this checkout" (no row). Time: the median
of --rounds interleaved rounds (benchmarks/timing.py: at each length every kernel runs once a round).
Memory: the most bytes PyTorch's CPU allocator held at once during one forward + backward call,
above what was held before it (tformer.profiling.peak_allocated_bytes: the allocator events
torch.profiler records with profile_memory=True, summed in time order); the output and the
gradients of q, k and v (4 x B x H x T x Dh floats, the same for every kernel) are part of it.

A kernel stops before a length whose predicted time per call (or memory) passes --time-limit
(--memory-limit), extrapolated from its two longest lengths; the table names each one's stopping
reason. Slopes: least squares on the log-log points of the upper half of the lengths it ran. The
crossover: the length from which performer / sliding_window stay faster than sdpa and than chunked
(interpolated on log-log axes between the lengths measured by both).

    python benchmarks/attention_scaling.py [--max-length 16384] [--rounds 3] [--threads 2]
        [--kernels sdpa,reference,...] [--out benchmarks/logs/attention_scaling.png]  # + .json beside it
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import interleaved  # noqa: E402
from tformer.memory import format_bytes  # noqa: E402
from tformer.nn.attention import attention_reference  # noqa: E402
from tformer.profiling import crossover, loglog_slope, peak_allocated_bytes  # noqa: E402

KERNELS = ("sdpa", "reference", "chunked", "performer", "sliding_window")
EXACT = ("sdpa", "chunked")  # what the approximate and local kernels are measured against
FAST = ("performer", "sliding_window")
HEAD_DIM, PERFORMER_FEATURES, WINDOW = 64, 256, 256

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def available_kernels() -> tuple[dict[str, Kernel], dict[str, str]]:
    """The kernels this checkout has, as functions of (q, k, v) (B, H, T, Dh) -> (B, H, T, Dh), and
    why each of the others is missing."""
    kernels: dict[str, Kernel] = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "reference": lambda q, k, v: attention_reference(q, k, v, is_causal=True)[0],
    }
    missing: dict[str, str] = {}
    try:
        from tformer.nn.attention import chunked_attention
    except ImportError:
        for name in ("chunked", "sliding_window"):
            missing[name] = "no tformer.nn.attention.chunked_attention"
    else:
        kernels["chunked"] = lambda q, k, v: chunked_attention(q, k, v, causal=True)
        kernels["sliding_window"] = lambda q, k, v: chunked_attention(q, k, v, causal=True, window=WINDOW)
    try:
        from tformer.nn.favor import performer_attention, random_features
    except ImportError:
        missing["performer"] = "no tformer.nn.favor"
    else:
        projection = random_features(PERFORMER_FEATURES, HEAD_DIM, generator=torch.Generator().manual_seed(0))
        kernels["performer"] = lambda q, k, v: performer_attention(q, k, v, projection, causal=True)
    return {name: kernels[name] for name in KERNELS if name in kernels}, missing


class Call:
    """One forward + backward of a kernel on fixed inputs (B, H, T, Dh), gradients cleared before each."""

    def __init__(self, kernel: Kernel, inputs: tuple[torch.Tensor, ...], upstream: torch.Tensor) -> None:
        self.kernel, self.inputs, self.upstream = kernel, inputs, upstream

    def __call__(self) -> None:
        for tensor in self.inputs:
            tensor.grad = None
        self.kernel(*self.inputs).backward(self.upstream)


def inputs_for(length: int, heads: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """q, k, v (1, H, T, 64) leaves that need gradients, and the gradient of the output."""
    generator = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, heads, length, HEAD_DIM, generator=generator).requires_grad_() for _ in range(3))
    return (q, k, v), torch.randn(1, heads, length, HEAD_DIM, generator=generator)


def predicted(points: list[tuple[int, float]], length: int) -> float:
    """A cost at ``length`` extrapolated from the two longest measured (length, cost) points (a power
    law through them; quadratic when only one is known)."""
    (shorter, low), (longer, high) = points[-2:] if len(points) > 1 else ((points[-1][0] / 2, points[-1][1] / 4),
                                                                          points[-1])
    exponent = max(math.log(high / low) / math.log(longer / shorter), 0.0) if low > 0 and high > 0 else 2.0
    return high * (length / longer) ** exponent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-length", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help=f"torch CPU threads (default here: {torch.get_num_threads()})")
    parser.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated subset of {', '.join(KERNELS)}")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per forward+backward call (20)")
    parser.add_argument("--memory-limit", type=float, default=6.0, help="GiB per call (6)")
    parser.add_argument("--out", type=Path, default=None, help="PNG of the log-log plot; the figures go to "
                        "the same name with .json")
    args = parser.parse_args()
    asked = [name.strip() for name in args.kernels.split(",") if name.strip()]
    unknown = [name for name in asked if name not in KERNELS]
    if unknown or not asked:
        parser.error(f"--kernels {args.kernels!r}: {', '.join(unknown) or 'none given'}; "
                     f"choose from {', '.join(KERNELS)}")
    if args.min_length < 1 or args.max_length < args.min_length or args.rounds < 1 or args.threads < 1:
        parser.error("--min-length, --rounds and --threads must be >= 1 and --max-length >= --min-length")
    if args.out is not None and args.out.suffix != ".png":
        parser.error(f"--out {args.out}: name a .png file (the figures are written beside it as .json)")
    torch.set_num_threads(args.threads)
    lengths = [args.min_length * 2**i for i in range(int(math.log2(args.max_length / args.min_length)) + 1)]
    kernels, missing = available_kernels()
    kernels = {name: kernel for name, kernel in kernels.items() if name in asked}
    print(f"causal self-attention, B=1, H={args.heads}, Dh={HEAD_DIM}, float32, {args.threads} threads, "
          f"torch {torch.__version__}; lengths {lengths[0]}..{lengths[-1]}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    for name in asked:
        if name in missing:
            print(f"{name}: not available on this checkout ({missing[name]})")

    seconds: dict[str, list[tuple[int, float]]] = {name: [] for name in kernels}
    peaks: dict[str, list[tuple[int, int]]] = {name: [] for name in kernels}
    stopped: dict[str, str] = {}
    memory_limit = args.memory_limit * 2**30
    for length in lengths:
        running = [name for name in kernels if name not in stopped]
        for name in running:
            if len(seconds[name]) and predicted(seconds[name], length) > args.time_limit:
                stopped[name] = (f"time: {predicted(seconds[name], length):.0f} s per call predicted at {length} "
                                 f"> --time-limit {args.time_limit:g} s")
            elif len(peaks[name]) and predicted(peaks[name], length) > memory_limit:
                stopped[name] = (f"memory: {format_bytes(predicted(peaks[name], length))} predicted at {length} "
                                 f"> --memory-limit {args.memory_limit:g} GiB")
        running = [name for name in running if name not in stopped]
        if not running:
            break
        inputs, upstream = inputs_for(length, args.heads)
        calls = {name: Call(kernels[name], inputs, upstream) for name in running}
        for name, call in calls.items():
            peaks[name].append((length, peak_allocated_bytes(call)))
        print(f"length {length}:", flush=True)
        times = interleaved(calls, rounds=args.rounds, steps=1)
        for name in running:
            seconds[name].append((length, statistics.median(times[name])))
        del inputs, upstream, calls
    for name in kernels:
        stopped.setdefault(name, f"ran every length up to {lengths[-1]}")

    print(f"\n{'length':>7} " + " ".join(f"{name + ' ms':>18} {'MiB':>8}" for name in kernels))
    for length in lengths:
        cells = []
        for name in kernels:
            time = dict(seconds[name]).get(length)
            peak = dict(peaks[name]).get(length)
            cells.append(f"{'-' if time is None else f'{time * 1000:,.1f}':>18} "
                         f"{'-' if peak is None else f'{peak / 2**20:,.1f}':>8}")
        print(f"{length:>7} " + " ".join(cells))

    slopes = {}
    print(f"\n{'kernel':<15} {'time slope':>10} {'memory slope':>12}  fitted on lengths; stopped")
    for name in kernels:
        upper = seconds[name][len(seconds[name]) // 2:] if len(seconds[name]) > 2 else seconds[name]
        upper_lengths = [length for length, _ in upper]
        memory = [peak for length, peak in peaks[name] if length in upper_lengths]
        if len(upper) >= 2:
            slopes[name] = {"time": loglog_slope(upper_lengths, [time for _, time in upper]),
                            "memory": loglog_slope(upper_lengths, memory), "lengths": upper_lengths}
            print(f"{name:<15} {slopes[name]['time']:>10.2f} {slopes[name]['memory']:>12.2f}  "
                  f"{upper_lengths[0]}..{upper_lengths[-1]}; {stopped[name]}")
        else:
            print(f"{name:<15} {'-':>10} {'-':>12}  too few lengths to fit; {stopped[name]}")

    crossovers = {}
    for fast in (name for name in FAST if name in kernels):
        for exact in (name for name in EXACT if name in kernels):
            common = sorted(set(dict(seconds[fast])) & set(dict(seconds[exact])))
            if not common:
                continue
            where = crossover(common, [dict(seconds[fast])[length] for length in common],
                              [dict(seconds[exact])[length] for length in common])
            crossovers[f"{fast} vs {exact}"] = where
            if where is None:
                text = f"not faster by {common[-1]} (the longest length both ran)"
            elif where == common[0]:
                text = f"faster from the shortest length on (<= {common[0]})"
            else:
                text = f"faster from about {where:,.0f} tokens on"
            print(f"crossover {fast} vs {exact}: {text}")
    if "chunked" in slopes and "sdpa" in kernels:
        at = 4096
        ratio = dict(seconds["chunked"]).get(at, math.nan) / dict(seconds["sdpa"]).get(at, math.nan)
        print(f"acceptance: chunked memory slope {slopes['chunked']['memory']:.2f} (target <= 1.1); chunked / sdpa "
              f"time at {at}: {ratio:.2f} (target <= 2)")
    print(f"load average {os.getloadavg()[0]:.2f}")

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        figures = {"settings": {"heads": args.heads, "head_dim": HEAD_DIM, "batch": 1, "dtype": "float32",
                                "causal": True, "threads": args.threads, "rounds": args.rounds,
                                "torch": torch.__version__, "date": f"{datetime.now(UTC):%Y-%m-%d}"},
                   "seconds": seconds, "peak_bytes": peaks, "stopped": stopped, "slopes": slopes,
                   "crossovers": crossovers, "not_available": missing}
        args.out.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
        plot(seconds, peaks, args.out, f"causal attention, B=1, H={args.heads}, Dh={HEAD_DIM}, fp32, "
                                        f"{args.threads} CPU thread{'s' if args.threads > 1 else ''}")
        print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


def plot(seconds: dict, peaks: dict, out: Path, title: str) -> None:
    """Time and peak memory against length, each on log-log axes, one line per kernel."""
    from tformer.viz.figures import pyplot, save_figure

    plt = pyplot()
    figure, (time_axes, memory_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in seconds:
        lengths = [length for length, _ in seconds[name]]
        time_axes.plot(lengths, [time * 1000 for _, time in seconds[name]], marker="o", label=name)
        memory_axes.plot([length for length, _ in peaks[name]], [peak / 2**20 for _, peak in peaks[name]],
                         marker="o", label=name)
    lengths = sorted({length for points in seconds.values() for length, _ in points})
    for axes, label in ((time_axes, "forward + backward, ms"), (memory_axes, "peak allocated, MiB")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(lengths, [f"{length:,}" for length in lengths])
        axes.set_yscale("log")
        axes.set_xlabel("sequence length")
        axes.set_ylabel(label)
        axes.grid(True, which="both", alpha=0.3)
    time_axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    save_figure(figure, out)


if __name__ == "__main__":
    main()
