"""What a positional scheme is: one class in its own file, listed by name in ``registry.py``.

A scheme is the module a stack keeps as ``positional``. It declares what it does, so the stack, the
kernels, decoding and configs ask it instead of comparing names:

- ``adds_embeddings``: absolute encodings added to the embedded tokens (``embeddings``);
- ``rotates``: angles that rotate queries and keys (``rotary_angles``);
- ``adds_bias``: an additive bias on the attention scores (``attention_bias``; its module is ``bias``);
- ``table``: positions index a table of ``max_len`` rows, so a longer sequence is an error;
- ``length_dependent``: what a position gets depends on the longest position of the pass (a dynamic RoPE
  scaling), so rows decoded in one batch share it and a cache filled in another pass cannot be reused;
- ``fields``: the ModelConfig fields it reads (any other scheme refuses them away from their defaults),
  checked by ``config_problem``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn


class PositionalScheme(nn.Module):
    """The base of every scheme: the defaults of one that adds nothing (``positional = "none"``)."""

    name: ClassVar[str] = "none"
    table: ClassVar[bool] = False
    adds_embeddings: ClassVar[bool] = False
    rotates: ClassVar[bool] = False
    adds_bias: ClassVar[bool] = False
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len

    @classmethod
    def from_config(cls, config: Any, causal: bool) -> PositionalScheme:
        """The scheme at a ModelConfig's sizes (``causal``: a decoder's stack; a bias may depend on it)."""
        return cls(config.max_seq_len)

    @classmethod
    def config_problem(cls, config: Any) -> str | None:
        """Why ``config``'s values of this scheme's fields cannot be used, or None."""
        return None

    @property
    def kind(self) -> str:
        """The scheme's registered name (``ModelConfig.positional``)."""
        return self.name

    @property
    def has_table(self) -> bool:
        """Whether positions index a fixed-size table (so longer sequences are an error)."""
        return self.table

    @property
    def length_dependent(self) -> bool:
        """Whether a position's encoding depends on the longest position of its pass."""
        return False

    def embeddings(self, position_ids: Tensor) -> Tensor | None:
        """(B, T) -> (B, T, D) absolute encodings, or None."""
        return None

    def rotary_angles(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
        """(B, T) -> cos, sin (B, 1, T, Dr) with Dr <= Dh the rotated dimensions, or None."""
        return None

    def attention_bias(self, query_positions: Tensor, key_positions: Tensor) -> Tensor | None:
        """(B, Tq), (B, Tk) -> additive bias (B, H, Tq, Tk), or None."""
        return None

    def extra_repr(self) -> str:
        return f"kind={self.name!r}"


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position of each token counting only attended ones: (B, T) mask -> (B, T) ids (0 on padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
