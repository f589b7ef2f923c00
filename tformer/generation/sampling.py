"""Choosing the next token from logits: greedy, or sampling after temperature, top-k and top-p."""

from __future__ import annotations

import torch
from torch import Tensor


def filter_top_k(logits: Tensor, top_k: int) -> Tensor:
    """Keep the ``top_k`` largest logits of each row (B, V); set the rest to -inf."""
    if top_k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, float("-inf"))


def filter_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most probable tokens whose probability reaches ``top_p`` (nucleus)."""
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    # A token is dropped when the tokens before it already reach top_p; the top one always stays.
    drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def next_token(
    logits: Tensor,
    do_sample: bool,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """(B, V) logits of the last position -> (B,) chosen ids."""
    if not do_sample:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = filter_top_p(logits, top_p)
    probabilities = logits.softmax(dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(-1)
