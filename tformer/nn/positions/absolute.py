"""Absolute positions added to the embedded tokens: a learned table (GPT-2, BERT) or fixed sinusoids
(the 2017 paper's, Marian's split layout, Whisper's encoder)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tformer.nn.positions.scheme import PositionalScheme


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


class LearnedScheme(PositionalScheme):
    """``positional = "learned"``: a learned table of ``max_seq_len`` rows."""

    name = "learned"
    table = True
    adds_embeddings = True

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__(max_len)
        self.absolute = LearnedPositions(max_len, d_model)

    @classmethod
    def from_config(cls, config, causal: bool) -> LearnedScheme:
        return cls(config.max_seq_len, config.d_model)

    def embeddings(self, position_ids: Tensor) -> Tensor:
        return self.absolute(position_ids)


class SinusoidalScheme(PositionalScheme):
    """``positional = "sinusoidal"``: the fixed table of the 2017 paper (``sinusoidal_layout``: its channels
    interleaved, or every sine first as Marian lays them out)."""

    name = "sinusoidal"
    table = True
    adds_embeddings = True
    fields = ("sinusoidal_layout",)

    def __init__(self, max_len: int, d_model: int, layout: str = "interleaved") -> None:
        super().__init__(max_len)
        self.absolute = SinusoidalPositions(max_len, d_model, layout=layout)

    @classmethod
    def from_config(cls, config, causal: bool) -> SinusoidalScheme:
        return cls(config.max_seq_len, config.d_model, config.sinusoidal_layout)

    @classmethod
    def config_problem(cls, config) -> str | None:
        if config.d_model % 2:
            return f"d_model={config.d_model} must be even for positional='sinusoidal'"
        return None

    def embeddings(self, position_ids: Tensor) -> Tensor:
        return self.absolute(position_ids)
