"""Positional schemes: absolute (sinusoidal, learned), rotary (RoPE), and additive
attention biases (ALiBi, T5-style bucketed relative positions).

Every scheme takes explicit position ids, so left-padded batches and cached decoding
give each token its true position.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(length: int, dim: int, base: float = 10000.0, layout: str = "interleaved") -> Tensor:
    """(length, dim) table of the 2017 paper: PE[t, 2i] = sin(t / base^(2i/dim)), PE[t, 2i+1] = cos(...);
    ``layout="split"`` puts every sine first, then every cosine (Marian's, fairseq's)."""
    positions = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    frequencies = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions * frequencies  # (length, dim/2)
    if layout == "split":
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()
    table = torch.empty(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.float()


def whisper_sinusoids(length: int, dim: int, max_timescale: float = 10000.0) -> Tensor:
    """(length, dim) Whisper's fixed encoder positions: every sine, then every cosine, at ``dim / 2``
    frequencies spread geometrically from 1 to 1 / ``max_timescale`` (the last frequency reaches it, where the
    2017 paper's table stops one step short). Computed in float32 as Whisper computes it, so a fresh table
    holds the very values of a fresh Hugging Face or OpenAI model (float64 would differ by up to 1e-4 at
    large angles)."""
    half = dim // 2
    increment = math.log(max_timescale) / (half - 1)
    frequencies = torch.exp(-increment * torch.arange(half, dtype=torch.float32))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * frequencies[None, :]  # (length, dim/2)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal position encodings added to token embeddings."""

    def __init__(self, max_len: int, dim: int, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, dim, base, layout), persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        """position_ids: (B, T) -> (B, T, D)."""
        return self.table[position_ids]


class LearnedPositions(nn.Module):
    """A learned table of absolute position embeddings (GPT-2, BERT)."""

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_len, dim)

    def forward(self, position_ids: Tensor) -> Tensor:
        """position_ids: (B, T) -> (B, T, D)."""
        return self.embedding(position_ids)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021) in the half-split layout used by Llama.

    Dimension i of the first half pairs with dimension i of the second half; each pair is
    rotated by the angle position * theta^(-2i/Dh).
    """

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inverse_frequencies = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inverse_frequencies", inverse_frequencies, persistent=False)

    def forward(self, position_ids: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """position_ids: (B, T) -> cos, sin, each (B, 1, T, Dh), computed in float32."""
        angles = position_ids.float().unsqueeze(-1) * self.inverse_frequencies  # (B, T, Dh/2)
        angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate queries or keys x: (B, H, T, Dh) by the angles in cos, sin: (B, 1, T, Dh)."""
    return x * cos + rotate_half(x) * sin


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


class Positional(nn.Module):
    """The positional scheme of one model, built from its config: absolute encodings added to
    the embeddings, rotary angles for queries and keys, or an additive attention bias.

    Models ask it for all three; the two that do not apply return None.
    """

    def __init__(self, kind: str, *, max_len: int, d_model: int, num_heads: int, head_dim: int,
                 rope_theta: float = 10000.0, causal: bool = True, relative_num_buckets: int = 32,
                 relative_max_distance: int = 128, sinusoidal_layout: str = "interleaved") -> None:
        super().__init__()
        self.kind = kind
        self.max_len = max_len
        # What the scheme adds, as plain flags: a decoding step asks for all three.
        self.adds_embeddings = kind in ("learned", "sinusoidal")
        self.rotates = kind == "rope"
        self.adds_bias = kind in ("alibi", "relative")
        if kind == "learned":
            self.absolute = LearnedPositions(max_len, d_model)
        elif kind == "sinusoidal":
            self.absolute = SinusoidalPositions(max_len, d_model, layout=sinusoidal_layout)
        elif kind == "rope":
            self.rotary = RotaryEmbedding(head_dim, rope_theta)
        elif kind == "alibi":
            self.bias = ALiBi(num_heads)
        elif kind == "relative":
            self.bias = RelativePositionBias(num_heads, not causal, relative_num_buckets, relative_max_distance)
        elif kind != "none":
            raise ValueError(f"positional={kind!r} is not one of learned, sinusoidal, rope, alibi, relative, none")

    @property
    def has_table(self) -> bool:
        """Whether positions index a fixed-size table (so longer sequences are an error)."""
        return self.kind in ("learned", "sinusoidal")

    def embeddings(self, position_ids: Tensor) -> Tensor | None:
        """(B, T) -> (B, T, D) absolute encodings, or None."""
        return self.absolute(position_ids) if self.adds_embeddings else None

    def rotary_angles(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
        """(B, T) -> cos, sin (B, 1, T, Dh), or None."""
        return self.rotary(position_ids, dtype) if self.rotates else None

    def attention_bias(self, query_positions: Tensor, key_positions: Tensor) -> Tensor | None:
        """(B, Tq), (B, Tk) -> additive bias (B, H, Tq, Tk), or None."""
        return self.bias(query_positions, key_positions) if self.adds_bias else None


def positional_from_config(config, causal: bool, kind: str | None = None) -> Positional:
    """The Positional module a ModelConfig asks for (``kind``: another scheme at the config's sizes)."""
    return Positional(
        config.positional if kind is None else kind, max_len=config.max_seq_len, d_model=config.d_model,
        num_heads=config.num_heads, head_dim=config.head_dim, rope_theta=config.rope_theta,
        causal=causal, relative_num_buckets=config.relative_num_buckets,
        relative_max_distance=config.relative_max_distance, sinusoidal_layout=config.sinusoidal_layout,
    )


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position of each token counting only attended ones: (B, T) mask -> (B, T) ids (0 on padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
