"""Positions as an additive bias on the attention scores: ALiBi (Press et al. 2022: a per-head linear
penalty on distance) and T5's learned bias per bucket of relative distance."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tformer.nn.positions.scheme import PositionalScheme


def alibi_slopes(num_heads: int) -> Tensor:
    """Per-head slopes of Press et al. 2022: a geometric sequence, interleaved when H is not a power of 2."""

    def powers_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return torch.tensor(powers_of_two(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = powers_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(powers_of_two(closest) + extra)


class ALiBi(nn.Module):
    """Attention with linear biases: each head penalises distance linearly with its own slope."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, query_positions: Tensor, key_positions: Tensor) -> Tensor:
        """Positions (B, Tq) and (B, Tk) -> additive bias (B, H, Tq, Tk) = -slope * |q - k|."""
        distance = (query_positions[:, :, None] - key_positions[:, None, :]).abs().float()
        return -self.slopes[None, :, None, None] * distance[:, None]


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """T5's buckets: exact for small offsets, logarithmic up to ``max_distance``, then clipped."""
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_bucket = max_exact + (
        torch.log(distance.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    log_bucket = torch.clamp(log_bucket, max=num_buckets - 1)
    return bucket + torch.where(is_small, distance, log_bucket)


class RelativePositionBias(nn.Module):
    """A learned scalar bias per head and relative-distance bucket (T5)."""

    def __init__(self, num_heads: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, query_positions: Tensor, key_positions: Tensor) -> Tensor:
        """Positions (B, Tq) and (B, Tk) -> additive bias (B, H, Tq, Tk)."""
        relative = key_positions[:, None, :] - query_positions[:, :, None]  # (B, Tq, Tk)
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return self.embedding(buckets).permute(0, 3, 1, 2)


class AlibiScheme(PositionalScheme):
    """``positional = "alibi"``: no table, so sequences may grow past ``max_seq_len``'s training length."""

    name = "alibi"
    adds_bias = True

    def __init__(self, max_len: int, num_heads: int) -> None:
        super().__init__(max_len)
        self.bias = ALiBi(num_heads)

    @classmethod
    def from_config(cls, config, causal: bool) -> AlibiScheme:
        return cls(config.max_seq_len, config.num_heads)

    def attention_bias(self, query_positions: Tensor, key_positions: Tensor) -> Tensor:
        return self.bias(query_positions, key_positions)


class RelativeScheme(PositionalScheme):
    """``positional = "relative"``: T5's buckets (``relative_num_buckets`` up to ``relative_max_distance``),
    one-sided in a causal stack and two-sided in a bidirectional one."""

    name = "relative"
    adds_bias = True
    fields = ("relative_num_buckets", "relative_max_distance")

    def __init__(self, max_len: int, num_heads: int, bidirectional: bool, num_buckets: int = 32,
                 max_distance: int = 128) -> None:
        super().__init__(max_len)
        self.bias = RelativePositionBias(num_heads, bidirectional, num_buckets, max_distance)

    @classmethod
    def from_config(cls, config, causal: bool) -> RelativeScheme:
        return cls(config.max_seq_len, config.num_heads, not causal, config.relative_num_buckets,
                   config.relative_max_distance)

    def attention_bias(self, query_positions: Tensor, key_positions: Tensor) -> Tensor:
        return self.bias(query_positions, key_positions)
