"""The ``sliding_window`` kernel: exact attention restricted to a band of ``attention_window`` (W) keys,
computed by the chunked kernel over the key blocks inside the band only; a decoder's cache keeps the
last W positions and a few more to take back rejected drafts (``RollingKVCache``). Cross-attention sees
its whole source (no band)."""

from __future__ import annotations

from typing import Any

import torch

from tformer.families import FAMILIES
from tformer.nn.attention.cache import RollingKVCache
from tformer.nn.attention.cache_spec import CacheSpec, CrossAttention, SlidingWindow
from tformer.nn.attention.chunked import ChunkedKernel

# Positions a decoding cache keeps beyond the window, so that speculative decoding can take back up to this
# many rejected drafts (a draft run proposes num_draft_tokens at a time).
REWIND_SLACK = 16


class SlidingWindowKernel(ChunkedKernel):
    """Causal: query i sees keys i - W .. i (itself and the W previous); bidirectional: |i - j| <= W,
    counted in sequence order. O(T W) time, O(T) memory, no dropout; weights for inspection."""

    name = "sliding_window"
    exact = False
    reads_pages = False  # a band, not the whole context
    fields = ("attention_window",)

    def __init__(self, head_dim: int, cross: bool = False, **settings: Any) -> None:
        super().__init__(head_dim, cross, **settings)
        if not cross:
            window = settings.get("attention_window")
            if not isinstance(window, int) or isinstance(window, bool) or window < 1:
                raise ValueError(f"attention_window={window!r} must be an integer >= 1 for the sliding_window kernel")
            self.window = window

    @classmethod
    def config_problem(cls, config: Any) -> str | None:
        limit = FAMILIES[config.architecture].sequence_limit(config)
        window = config.attention_window
        if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= limit:
            return (f"attention_window={window!r} must be an integer in [1, {limit}] (the longest sequence of "
                    f"architecture={config.architecture!r}) for attention_kernel='sliding_window'")
        return None

    def new_cache(self, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                  device: torch.device) -> RollingKVCache:
        return RollingKVCache(batch_size, num_kv_heads, self.window + REWIND_SLACK, head_dim, dtype, device,
                              window=self.window, max_len=max_len)

    def cache_spec(self, num_kv_heads: int, head_dim: int) -> CacheSpec:
        return CrossAttention(num_kv_heads, head_dim) if self.cross else SlidingWindow(num_kv_heads, head_dim,
                                                                                      self.window)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(window={self.window})"
