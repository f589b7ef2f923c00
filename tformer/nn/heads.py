"""Heads: what turns the stack's hidden states (B, T, D) into a task's outputs."""

from __future__ import annotations

from torch import nn


class LMHead(nn.Linear):
    """Hidden states (B, T, D) -> next-token logits (B, T, V): one bias-free projection, whose
    weight may be the token table itself (``tie_embeddings``)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__(d_model, vocab_size, bias=False)
