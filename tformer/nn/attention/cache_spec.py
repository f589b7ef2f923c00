"""What each attention layer keeps between decoding steps, declared as a spec (as vLLM's per-layer key/value cache
specs): the serving engine allocates from the specs instead of assuming one uniform cache, and sizes its memory
from their bytes.

- ``FullAttention``: every position's keys and values, stored per token (paged in the engine).
- ``SlidingWindow``: keys and values too, of which a query reads only the last ``window`` + 1 positions.
- ``RunningSums``: Performer's running sums over the keys' features: one fixed-size state per sequence, whatever
  its length, and no per-token storage (so no prefix of it can be shared or forgotten).
- ``CrossAttention``: the keys and values cross-attention projects from the encoder's output on the first step,
  fixed for the sequence's life: sized by the source, not by the tokens decoded.

``paged``: whether the spec is stored per token (in the engine's blocks); ``bytes_per_token`` and
``bytes_per_sequence`` are what one token and one sequence take of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass(frozen=True)
class CacheSpec:
    """A layer's cache: its key/value heads and head size, and what it keeps of them (the subclass)."""

    num_kv_heads: int
    head_dim: int
    paged: ClassVar[bool] = True

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes one token of one sequence adds to the cache, keys and values together (0 when not per token)."""
        return 2 * self.num_kv_heads * self.head_dim * dtype.itemsize if self.paged else 0

    def bytes_per_sequence(self, dtype: torch.dtype) -> int:
        """Bytes one sequence holds whatever its length (a running state)."""
        return 0


@dataclass(frozen=True)
class FullAttention(CacheSpec):
    """Every position's keys and values: each query reads them all."""


@dataclass(frozen=True)
class SlidingWindow(CacheSpec):
    """Keys and values of which a query at position i reads positions i - ``window`` .. i."""

    window: int = 0


@dataclass(frozen=True)
class RunningSums(CacheSpec):
    """Performer's causal state: per key/value head, the sums over ``features`` random features of the keys, times
    the values and a column of ones (the normaliser), with two stabilisers; kept in float32 at least."""

    features: int = 0
    paged: ClassVar[bool] = False

    def bytes_per_sequence(self, dtype: torch.dtype) -> int:
        state = torch.promote_types(dtype, torch.float32)
        return self.num_kv_heads * (self.features * (self.head_dim + 1) + 2) * state.itemsize


@dataclass(frozen=True)
class CrossAttention(CacheSpec):
    """The keys and values of the encoder's output, projected once per sequence: sized by its source length."""

    paged: ClassVar[bool] = False


@dataclass(frozen=True)
class LayerCacheSpec:
    """The specs of one block: its self-attention's, and its cross-attention's when it has one (``LayerCache``'s
    two backends)."""

    self_attention: CacheSpec
    cross_attention: CacheSpec | None = None
