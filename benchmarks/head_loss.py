"""The next-token loss at GPT-2's head, forward and backward, the logits whole or in pieces (``losses.head_loss``):
what sets ``HEAD_LOSS_MIN_ROWS`` and ``HEAD_LOSS_WHOLE_FLOATS``.

    python benchmarks/head_loss.py                 # GPT-2's head (768 -> 50,257), 1,024 positions, 2 threads
    python benchmarks/head_loss.py --quick         # a tiny head: checks that every way runs

Each way takes the loss of random hidden states (seed 0) against random targets and its gradients: the hidden
states' always, the head weight's when the head trains. "whole": ``token_cross_entropy`` over the whole (N, V)
logits, autograd's backward; "pieces R": ``head_loss`` with pieces of R positions (its gradients taken in the forward
pass). The ways run interleaved round by round (``timing.interleaved``), medians of the rounds reported, with each
way's time over whole's. Frozen head first (LoRA, QLoRA), then trained (full fine-tuning).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import interleaved  # noqa: E402

from tformer.nn import losses  # noqa: E402

PIECE_ROWS = (128, 166, 256, 512)  # 166: 2^23 floats of GPT-2's logits


def ways(head: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor) -> dict:
    """One step of each way: the loss and its gradients."""

    def whole() -> None:
        head.zero_grad(set_to_none=True)
        losses.token_cross_entropy(head(hidden.detach().requires_grad_()), targets).backward()

    def pieces(rows: int) -> None:
        head.zero_grad(set_to_none=True)
        losses.HEAD_LOSS_MIN_ROWS, losses.HEAD_LOSS_CHUNK_FLOATS, losses.HEAD_LOSS_WHOLE_FLOATS = rows, 0, 0
        losses.head_loss(head, head.parameters(), hidden.detach().requires_grad_(), targets,
                         head.out_features).backward()

    return {"whole": whole, **{f"pieces {rows}": (lambda rows=rows: pieces(rows)) for rows in PIECE_ROWS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny head and few positions")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    width, vocab, positions = (32, 300, 600) if args.quick else (768, 50257, 1024)
    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(positions, width, generator=generator)
    targets = torch.randint(0, vocab, (positions,), generator=generator)
    print(f"head {width} -> {vocab:,}, {positions:,} positions, {args.threads} threads, torch {torch.__version__}")
    for trained in (False, True):
        head.weight.requires_grad_(trained)
        print(f"-- head {'trained' if trained else 'frozen'}", flush=True)
        times = interleaved(ways(head, hidden, targets), rounds=args.rounds, steps=1)
        medians = {way: statistics.median(seconds) for way, seconds in times.items()}
        for way, seconds in medians.items():
            print(f"{way:<12} {seconds * 1000:8.0f} ms  {seconds / medians['whole']:.2f}x whole's time")


if __name__ == "__main__":
    main()
