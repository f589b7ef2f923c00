"""Checks of what enters a model: token ids, attention masks and positions, one message each.

Value checks read tensor contents, which costs a host sync on an accelerator; they are skipped
while ``torch.compile`` traces (a compiled training step is fed by the data pipeline).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

INTEGER_DTYPES = (torch.long, torch.int32, torch.int64)


def check_token_ids(
    input_ids: Tensor, vocab_size: int, name: str = "input_ids", what: str = "token id", table: str = "the vocabulary"
) -> None:
    """``input_ids`` must be (batch, length) integers in [0, vocab_size); ``name``, ``what`` and
    ``table`` word the message for other id tensors (token types)."""
    if input_ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {tuple(input_ids.shape)}")
    if input_ids.dtype not in INTEGER_DTYPES:
        raise ValueError(f"{name} must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.numel() and not torch.compiler.is_compiling():
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{what} {bad} is outside {table} [0, {vocab_size})")


def check_attention_mask(attention_mask: Tensor, expected: tuple[int, int]) -> None:
    """``attention_mask`` must be (batch, cached + new tokens) of 0 (padding) and 1 (attend): a
    2 or a 0.5 would otherwise be read as 1 and so mean nothing the caller intended."""
    if tuple(attention_mask.shape) != expected:
        raise ValueError(
            f"attention_mask must have shape {expected} (batch, cached + new tokens), "
            f"got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype != torch.bool and attention_mask.numel() and not torch.compiler.is_compiling():
        other = (attention_mask != 0) & (attention_mask != 1)
        if bool(other.any()):
            raise ValueError(f"attention_mask holds {attention_mask[other][0].item()!r}; it must hold only "
                             "0 (padding) and 1 (attend)")


def warn_if_no_targets(targets: Tensor, ignore_index: int) -> None:
    """Warn (once) when every target is ``ignore_index``: the mean loss over no token is NaN."""
    if targets.numel() and not torch.compiler.is_compiling() and not bool((targets != ignore_index).any()):
        warnings.warn(f"every label is ignored ({ignore_index}), so the loss is NaN: there is no token to predict "
                      "(a one-token sequence, or labels masked out entirely)", stacklevel=3)


def check_positions(position_ids: Tensor, limit: int | None, kind: str) -> None:
    """Positions must index inside a fixed position table of ``limit`` rows (None: no table)."""
    if limit is None or torch.compiler.is_compiling() or not position_ids.numel():
        return
    largest = int(position_ids.max())
    if largest >= limit:
        raise ValueError(
            f"position {largest} is beyond max_seq_len={limit} of this model's {kind} position table; "
            f"use at most {limit} tokens"
        )
