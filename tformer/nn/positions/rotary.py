"""Rotary positions (RoPE, Su et al. 2021) in the half-split layout Llama uses, with Hugging Face's scaling
types (``rope_scaling.py``) and rotation of a leading share of each head (``partial_rotary_factor``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from tformer.nn.positions.rope_scaling import ROPE_SCALINGS, default_frequencies, rope_scaling_problem
from tformer.nn.positions.scheme import PositionalScheme


def rotary_dimensions(head_dim: int, partial_rotary_factor: float = 1.0) -> int:
    """How many leading dimensions of each head rotate: int(head_dim x factor), as Hugging Face counts them."""
    return int(head_dim * partial_rotary_factor)


class RotaryEmbedding(nn.Module):
    """cos and sin of position x inverse frequency for the rotated dimensions of each head.

    Dimension i of the first half of the rotated share pairs with dimension i of its second half; the pair
    turns by the angle position x theta^(-2i/Dr), Dr the rotated dimensions (``rotary_dim``, the head's by
    default), the frequencies scaled by ``scaling`` (``ModelConfig.rope_scaling``) when it is given.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None,
                 scaling: Mapping[str, Any] | None = None, max_seq_len: int = 2048) -> None:
        super().__init__()
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        self.scaling = None if scaling is None else ROPE_SCALINGS[scaling["rope_type"]](
            scaling, self.rotary_dim, base, max_seq_len)
        if self.scaling is None:
            inverse_frequencies, self.attention_factor = default_frequencies(self.rotary_dim, base), 1.0
        else:
            inverse_frequencies, self.attention_factor = self.scaling.frequencies()
        self.register_buffer("inverse_frequencies", inverse_frequencies, persistent=False)

    @property
    def length_dependent(self) -> bool:
        """Whether the frequencies depend on the longest position of a pass (dynamic and LongRoPE scaling)."""
        return self.scaling is not None and self.scaling.length_dependent

    def forward(self, position_ids: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """position_ids: (B, T) -> cos, sin, each (B, 1, T, Dr), computed in float32."""
        inverse_frequencies, factor = self.inverse_frequencies, self.attention_factor
        if self.length_dependent and position_ids.numel():
            inverse_frequencies, factor = self.scaling.frequencies(int(position_ids.max()) + 1)
            inverse_frequencies = inverse_frequencies.to(position_ids.device)
        angles = position_ids.float().unsqueeze(-1) * inverse_frequencies  # (B, T, Dr/2)
        angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)
        cos, sin = angles.cos(), angles.sin()
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate queries or keys x: (B, H, T, Dh) by the angles in cos, sin: (B, 1, T, Dr); with Dr < Dh only
    the first Dr dimensions turn and the rest pass as they are."""
    rotated = cos.shape[-1]
    if rotated == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    turning, passing = x[..., :rotated], x[..., rotated:]
    return torch.cat([turning * cos + rotate_half(turning) * sin, passing], dim=-1)


class RotaryScheme(PositionalScheme):
    """``positional = "rope"``: no table; ``rope_theta`` the base, ``rope_scaling`` a scaling type,
    ``partial_rotary_factor`` the share of each head that rotates."""

    name = "rope"
    rotates = True
    fields = ("rope_theta", "rope_scaling", "partial_rotary_factor")

    def __init__(self, max_len: int, head_dim: int, base: float = 10000.0, *,
                 scaling: Mapping[str, Any] | None = None, partial_rotary_factor: float = 1.0) -> None:
        super().__init__(max_len)
        self.rotary = RotaryEmbedding(head_dim, base, rotary_dim=rotary_dimensions(head_dim, partial_rotary_factor),
                                      scaling=scaling, max_seq_len=max_len)

    @classmethod
    def from_config(cls, config, causal: bool) -> RotaryScheme:
        return cls(config.max_seq_len, config.head_dim, config.rope_theta, scaling=config.rope_scaling,
                   partial_rotary_factor=config.partial_rotary_factor)

    @classmethod
    def config_problem(cls, config) -> str | None:
        factor = config.partial_rotary_factor
        if not (isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor <= 1):
            return f"partial_rotary_factor={factor!r} must be a number in (0, 1] (the share of each head that rotates)"
        rotated = rotary_dimensions(config.head_dim, factor)
        if rotated < 2 or rotated % 2:
            share = f" x partial_rotary_factor={factor!r} = {rotated}" if factor != 1 else ""
            return f"head_dim={config.head_dim}{share} must be even (and >= 2) for positional='rope'"
        return rope_scaling_problem(config.rope_scaling, rotated)

    @property
    def length_dependent(self) -> bool:
        return self.rotary.length_dependent

    def rotary_angles(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return self.rotary(position_ids, dtype)
