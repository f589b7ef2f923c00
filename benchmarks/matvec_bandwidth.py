"""How fast one row meets every weight of a model: the bytes per second of the ways the prepacked backend races
for a few rows (``tformer/nn/weights/prepacked.py``: its compiled kernel, the batched product over blocks of
output rows) and of ``F.linear`` (what Hugging Face runs), over a random model's weights.

    python benchmarks/matvec_bandwidth.py                  # Llama-3.2-1B's shapes
    python benchmarks/matvec_bandwidth.py --shape qwen     # Qwen2.5-0.5B's
    python benchmarks/matvec_bandwidth.py --shape qwen --dtype bf16 --small   # bfloat16; small weights' call costs

A decoding step at batch 1 reads every weight once, so its time is the model's bytes over this figure. Each round
multiplies one row by every weight in the model's order (fused q/k/v, attention output, fused gate/up, down, per
layer, then the tied output head), one way after another in an order that rotates from round to round; the median
round of each way is reported, as GB/s (weights' bytes / seconds), and then each way's on the feed-forward's down
projection (width x feed-forward width) alone, the shape where the ways differ most. The host's memory
bandwidth is measured first (a float32 sum over 1 GiB): a decoding step cannot read faster. ``--dtype bf16``: the
weights (and rows) in bfloat16, half the bytes. ``--small``: then what one product costs at the sizes of a small
model's step, where the weights stay in cache and a call's fixed cost is the time: microseconds a call of
``F.linear`` and of the prepacked layer inside a decoding step, at 1 and 8 rows, on a width-128 model's weights.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import memory_read_bandwidth  # noqa: E402

from tformer.nn import compiled  # noqa: E402
from tformer.nn.weights import PrepackedLinear  # noqa: E402
from tformer.nn.weights.backend import decoding_step  # noqa: E402

# (width, layers, q/k/v rows, feed-forward width, vocabulary) of each shape
SHAPES = {"llama": (2048, 16, 2048 + 2 * 512, 8192, 128256), "qwen": (896, 24, 896 + 2 * 128, 4864, 151936)}
# (out, in) of a width-128 model's projections: q/k/v fused, attention output, feed-forward in and out
SMALL = [(384, 128), (128, 128), (512, 128), (128, 512)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def model_weights(shape: str, generator: torch.Generator, dtype: torch.dtype) -> list[torch.Tensor]:
    """The (out, in) weights a decoding step reads, in order."""
    width, layers, qkv, feedforward, vocabulary = SHAPES[shape]
    per_layer = [(qkv, width), (width, width), (2 * feedforward, width), (width, feedforward)]
    return [torch.randn(shape, generator=generator).to(dtype) for _ in range(layers) for shape in per_layer] + [
        torch.randn(vocabulary, width, generator=generator).to(dtype)]


def ways(weights: list[torch.Tensor], threads: int) -> dict:
    """Each way, as a call that multiplies one row by every weight ("split" where every weight's rows divide among the
    threads)."""
    rows = [torch.randn(1, weight.shape[1]).to(weight.dtype) for weight in weights]
    kernels = compiled.load()
    pairs = list(zip(rows, weights, strict=True))
    calls = {"compiled": lambda: [kernels.float_matvec(row, weight, compiled.NONE) for row, weight in pairs]}
    if all(weight.shape[0] % threads == 0 for weight in weights):  # one block of output rows per thread
        blocks = [(weight.view(threads, weight.shape[0] // threads, weight.shape[1]), row.t().expand(threads, -1, -1))
                  for row, weight in pairs]
        calls["split"] = lambda: [torch.bmm(part, column) for part, column in blocks]
    calls["F.linear"] = lambda: [F.linear(row, weight) for row, weight in pairs]
    return calls


def measure(calls: dict, rounds: int) -> dict[str, float]:
    """Each call's median seconds over ``rounds`` rounds, the order rotating from round to round."""
    names, seconds = list(calls), {name: [] for name in calls}
    for name in names:
        calls[name]()  # warm up
    for round_index in range(rounds):
        for name in names[round_index % len(names):] + names[: round_index % len(names)]:
            started = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in seconds.items()}


def small_products(dtype: torch.dtype, rounds: int) -> None:
    """Microseconds a call of ``F.linear`` and of the prepacked layer (inside a decoding step) over each of
    ``SMALL``'s weights, at 1 and 8 rows: medians of ``rounds`` rounds of 200 calls each."""
    print(f"small weights ({dtype}): microseconds a call, F.linear / prepacked layer in a decoding step")
    generator = torch.Generator().manual_seed(0)
    for size_out, size_in in SMALL:
        linear = torch.nn.Linear(size_in, size_out).to(dtype)
        layer = PrepackedLinear.from_linear(linear)
        cells = []
        for count in (1, 8):
            x = torch.randn(count, size_in, generator=generator).to(dtype)
            calls = {"F.linear": lambda x=x, linear=linear: [linear(x) for _ in range(200)],
                     "prepacked": lambda x=x, layer=layer: [layer(x) for _ in range(200)]}
            seconds = measure(calls, rounds)
            cells.append(f"{count} row{'s' * (count > 1)}: {seconds['F.linear'] / 200 * 1e6:.1f} / "
                         f"{seconds['prepacked'] / 200 * 1e6:.1f}")
        print(f"  {size_out} x {size_in}: " + "   ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--small", action="store_true", help="then small weights' cost a call (see above)")
    args = parser.parse_args()
    threads, dtype = torch.get_num_threads(), DTYPES[args.dtype]
    print(f"torch {torch.__version__}, {threads} CPU threads, load average at start {os.getloadavg()[0]:.1f}")
    print(f"memory: a float32 sum over 1 GiB reads {memory_read_bandwidth():.1f} GB/s")
    weights = model_weights(args.shape, torch.Generator().manual_seed(0), dtype)
    size = weights[0].element_size()
    gigabytes = sum(weight.numel() for weight in weights) * size / 1e9
    print(f"{args.shape} shape, {args.dtype}: {len(weights)} weights, {gigabytes:.2f} GB; medians of {args.rounds} "
          "rounds")
    with torch.no_grad():
        seconds = measure(ways(weights, threads), args.rounds)
        print("every weight: " + "  ".join(f"{way} {gigabytes / value:.1f} GB/s ({value * 1e3:.0f} ms)"
                                             for way, value in seconds.items()))
        down = weights[3]  # (width, feed-forward width)
        down_seconds = measure(ways([down] * 8, threads), args.rounds)
        print(f"down projection {tuple(down.shape)}: " + "  ".join(
            f"{way} {down.numel() * size * 8 / value / 1e9:.1f} GB/s" for way, value in down_seconds.items())
            + "  (the same weight 8 times a round: partly in cache)")
        if args.small:
            with decoding_step:
                small_products(dtype, args.rounds)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
