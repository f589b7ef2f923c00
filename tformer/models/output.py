"""The result of a model's forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class GenerationState:
    """What ``prepare_generation`` returns: where the decoder starts, and what each step needs."""

    input_ids: Tensor  # (B, T0) the decoder's prompt: a decoder's own, an encoder–decoder's start tokens
    attention_mask: Tensor | None = None  # (B, T0) 1 = token, 0 = left padding; None: no padding
    # Keyword arguments of every forward step, each indexed by row (B, ...), reordered with the rows:
    # e.g. encoder_output (B, S, D) and encoder_attention_mask (B, S).
    step_inputs: dict[str, Tensor] = field(default_factory=dict)
