"""The result of a model's forward pass."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class ModelOutput:
    """``logits`` always; ``loss`` when labels were given; per-layer ``attentions``
    (B, H, Tq, Tk) and ``hidden_states`` (B, T, D) when asked for; ``cache`` when decoding."""

    logits: Tensor
    loss: Tensor | None = None
    attentions: list[Tensor] | None = None
    hidden_states: list[Tensor] | None = None
    cache: object | None = None
