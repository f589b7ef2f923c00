"""One layer's decode attention over the serving engine's paged pool: the in-place kernel
(``nn/attention/paged_decode.cpp``) against gathering every sequence's keys and values into one
left-padded batch for PyTorch's ``scaled_dot_product_attention`` (the engine's other path), and against
sdpa on a cache that is already dense and padded (what ``generate``'s batches read).

    python benchmarks/paged_attention.py --threads 2 --rounds 15

Shapes: GPT-2 124M (12 heads of 64) and gpt-mini (6 heads of 32), 16 sequences of random lengths (GPT-2:
16..400 tokens, gpt-mini: 8..250), their blocks of 16 scattered through the pool as the engine hands them out.
Times are the median over interleaved rounds; outputs are checked equal (to 1e-5) before timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import interleaved  # noqa: E402
from tformer.nn.attention.paged_kernel import paged_decode  # noqa: E402

SHAPES = {"gpt2": dict(heads=12, head_dim=64, lengths=(16, 400)),
          "gpt-mini": dict(heads=6, head_dim=32, lengths=(8, 250))}
SEQUENCES, BLOCK = 16, 16


def layer(heads: int, head_dim: int, lengths: tuple[int, int], seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(*lengths, (SEQUENCES,), generator=generator).tolist()
    blocks = [-(-size // BLOCK) for size in sizes]
    order = torch.randperm(sum(blocks), generator=generator)
    keys = torch.randn(len(order) * BLOCK, heads, head_dim, generator=generator)
    values = torch.randn(len(order) * BLOCK, heads, head_dim, generator=generator)
    contexts, taken = [], 0
    for size, count in zip(sizes, blocks, strict=True):
        rows = (order[taken:taken + count, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:size]
        contexts.append(rows)
        taken += count
    longest = max(sizes)
    padded = torch.zeros(SEQUENCES, longest, dtype=torch.long)
    for index, rows in enumerate(contexts):
        padded[index, longest - len(rows):] = rows
    real = torch.arange(longest)[None] >= (longest - torch.tensor(sizes))[:, None]
    mask = torch.zeros(SEQUENCES, 1, 1, longest).masked_fill(~real[:, None, None], float("-inf"))
    queries = torch.randn(SEQUENCES, heads, head_dim, generator=generator)
    dense_keys = keys.index_select(0, padded.view(-1)).view(SEQUENCES, longest, heads, head_dim).transpose(1, 2)
    dense_values = values.index_select(0, padded.view(-1)).view(SEQUENCES, longest, heads, head_dim).transpose(1, 2)
    dense_keys, dense_values = dense_keys.contiguous(), dense_values.contiguous()
    context, offsets = torch.cat(contexts), torch.tensor([0] + sizes).cumsum(0)

    def gather() -> torch.Tensor:
        context_keys = keys.index_select(0, padded.view(-1)).view(SEQUENCES, longest, heads, head_dim).transpose(1, 2)
        context_values = values.index_select(0, padded.view(-1)).view(SEQUENCES, longest, heads, head_dim)
        return F.scaled_dot_product_attention(queries[:, :, None], context_keys, context_values.transpose(1, 2),
                                              attn_mask=mask)[:, :, 0]

    def in_place() -> torch.Tensor:
        return paged_decode(queries, keys, values, context, offsets)

    def dense() -> torch.Tensor:
        return F.scaled_dot_product_attention(queries[:, :, None], dense_keys, dense_values, attn_mask=mask)[:, :, 0]

    torch.testing.assert_close(in_place(), gather(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dense(), gather(), rtol=1e-5, atol=1e-5)
    return {"gather + sdpa": gather, "in place": in_place, "sdpa on a dense cache": dense, "sizes": sizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="calls per round")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name, shape in SHAPES.items():
        work = layer(**shape)
        sizes = work.pop("sizes")
        seconds = interleaved(work, args.rounds, args.steps)
        medians = {label: statistics.median(times) * 1e3 for label, times in seconds.items()}
        mean = sum(sizes) / len(sizes)
        print(f"{name}: {SEQUENCES} sequences of {min(sizes)}-{max(sizes)} tokens (mean {mean:.0f}), {args.threads} "
              f"threads, median of {args.rounds} rounds:")
        for label, value in medians.items():
            print(f"  {label:24s} {value:7.3f} ms  ({medians['gather + sdpa'] / value:.2f}x the gather)")


if __name__ == "__main__":
    main()
