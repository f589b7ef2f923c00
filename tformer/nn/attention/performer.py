"""The ``performer`` kernel: FAVOR+ (``nn/favor.py``), softmax attention estimated with
``performer_features`` positive random features per head, in time and memory linear in length.

It decodes with its own cache: causal Performer attention needs of the past only two running sums
over the keys' features (``PerformerState``), so a step costs the same at any length and the cache
never grows; in exchange it cannot forget tokens (no speculative decoding)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tformer.nn.attention.cache_spec import CacheSpec, CrossAttention, RunningSums
from tformer.nn.attention.kernel import AttentionKernel
from tformer.nn.attention.mask import AttentionMask
from tformer.nn.favor import (
    PerformerProjection,
    PerformerState,
    decode_one,
    decode_unchecked,
    performer_attention,
    projection_for_decoding,
)


class PerformerKernel(AttentionKernel):
    """FAVOR+ with this layer's own ``PerformerProjection`` (redrawn every ``performer_redraw_interval``
    training steps; 0: drawn once). It has no score matrix, so no weights and no additive position bias."""

    name = "performer"
    exact = False
    weights = False
    position_bias = False
    custom_scale = False  # its features estimate softmax at head_dim**-0.5
    fields = ("performer_features", "performer_redraw_interval")

    def __init__(self, head_dim: int, cross: bool = False, **settings: Any) -> None:
        super().__init__(head_dim, cross, **settings)
        self.projection = PerformerProjection(settings.get("performer_features", 256), head_dim,
                                              settings.get("performer_redraw_interval", 0))
        self._decoding_weights: tuple | None = None  # (the projection it was made from, the weights)

    @classmethod
    def config_problem(cls, config: Any) -> str | None:
        features, redraw = config.performer_features, config.performer_redraw_interval
        if not isinstance(features, int) or isinstance(features, bool) or features < 1:
            return f"performer_features={features!r} must be a positive integer"
        if not isinstance(redraw, int) or isinstance(redraw, bool) or redraw < 0:
            return (f"performer_redraw_interval={redraw!r} must be an integer >= 0 (training steps between redraws; "
                    "0: draw once)")
        return None

    def modules(self) -> dict[str, nn.Module]:
        return {"performer": self.projection}

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, dropout_p: float = 0.0,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        self._check(mask, need_weights)
        return performer_attention(q, k, v, self.projection(), causal=mask.causal,
                                   key_padding_mask=mask.key_padding), None

    def decode(self, q: Tensor, k: Tensor, v: Tensor, key_padding: Tensor | None,
               state: PerformerState | None) -> tuple[Tensor, PerformerState]:
        """Causal attention of new positions (queries, keys and values of the same T) after ``state``; a step
        of one real token reads the projection as ``decode_one`` wants it, made once per projection."""
        projection = self.projection()
        if state is None or q.shape[2] != 1 or key_padding is not None:
            return decode_unchecked(q, k, v, projection, state, key_padding)
        scale = self.head_dim ** -0.5
        key = (projection.data_ptr(), projection._version, state.sums.dtype)
        if self._decoding_weights is None or self._decoding_weights[0] != key:
            self._decoding_weights = key, projection_for_decoding(projection, state.sums.dtype, scale)
        return decode_one(q, k, v, self._decoding_weights[1], state, scale)

    @staticmethod
    def _check(mask: AttentionMask, need_weights: bool) -> None:
        if need_weights:
            raise ValueError("attention_kernel='performer' has no attention weights to return "
                             "(need_weights / output_attentions); use an exact kernel to inspect them")
        if mask.position_bias is not None:
            raise ValueError("attention_kernel='performer' cannot add a position bias (it forms no scores)")

    def new_cache(self, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                  device: torch.device) -> PerformerCache:
        return PerformerCache()

    def cache_spec(self, num_kv_heads: int, head_dim: int) -> CacheSpec:
        if self.cross:
            return CrossAttention(num_kv_heads, head_dim)
        return RunningSums(num_kv_heads, head_dim, self.projection.projection.shape[0])


class PerformerCache:
    """A causal Performer layer's decoding cache: the ``PerformerState`` of every key seen, not the keys."""

    rewindable = False  # running sums cannot forget a token

    def __init__(self) -> None:
        self.state: PerformerState | None = None
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        if value != self._length:
            raise ValueError(f"attention_kernel='performer' keeps running sums over the keys, not the keys: its "
                             f"cache cannot go back from {self._length} to {value} tokens (no speculative decoding)")

    def attend(self, kernel: PerformerKernel, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        kernel._check(mask, need_weights)
        new = k.shape[2]
        padding = None if mask.key_padding is None or mask.real_queries else mask.key_padding[:, -new:]
        out, self.state = kernel.decode(q, k, v, padding, self.state)
        self._length += new
        return out, None

    def reorder(self, batch_indices: Tensor) -> None:
        if self.state is not None:
            self.state = self.state.index_select(batch_indices)

    def grow(self, max_len: int) -> None:
        """Nothing to do: the state has one size whatever the length."""

    def nbytes(self) -> int:
        if self.state is None:
            return 0
        return sum(t.nbytes for t in (self.state.sums, self.state.level, self.state.raw_max))


class RunningSumSlots:
    """One Performer layer's states in the serving engine, as a cache backend of a paged step: one row of storage
    per running sequence (its ``state_slot``), not per token. A step's one-token sequences read their rows as one
    batch, decode, and write them back; each prefill starts a row from its prompt."""

    rewindable = False

    def __init__(self, spec: RunningSums, slots: int, dtype: torch.dtype, device: torch.device) -> None:
        state = torch.promote_types(dtype, torch.float32)
        heads, features, head_dim = spec.num_kv_heads, spec.features, spec.head_dim
        self.sums = torch.zeros(slots, heads, features, head_dim + 1, dtype=state, device=device)  # (S, Hkv, M, Dh + 1)
        self.level = torch.zeros(slots, heads, dtype=state, device=device)  # (S, Hkv)
        self.raw_max = torch.zeros(slots, heads, dtype=state, device=device)  # (S, Hkv)

    def read(self, slots: Tensor) -> PerformerState:
        """The states of ``slots`` (B,) as one batch (copies)."""
        return PerformerState(self.sums.index_select(0, slots), self.level.index_select(0, slots),
                              self.raw_max.index_select(0, slots))

    def write(self, slots: Tensor, state: PerformerState) -> None:
        for storage, tensor in ((self.sums, state.sums), (self.level, state.level), (self.raw_max, state.raw_max)):
            storage.index_copy_(0, slots, tensor.to(storage.dtype))

    def attend(self, kernel: PerformerKernel, q: Tensor, k: Tensor, v: Tensor, mask: Any,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """q (1, H, N, Dh), k and v (1, Hkv, N, Dh): the step's rows (``mask``: its ``PagedMask``) -> (1, H, N, Dh)."""
        if need_weights:
            raise ValueError("attention_kernel='performer' has no attention weights to return")
        layout = mask.layout
        queries, keys, values = (tensor[0].transpose(0, 1) for tensor in (q, k, v))  # (N, heads, Dh)
        out = torch.empty_like(queries)
        if layout.decode_rows is not None:
            rows, slots = layout.decode_rows, layout.decode_state_slots
            step, state = kernel.decode(queries[rows].unsqueeze(2), keys[rows].unsqueeze(2), values[rows].unsqueeze(2),
                                        None, self.read(slots))  # (Bd, H, 1, Dh)
            out[rows] = step.squeeze(2)
            self.write(slots, state)
        for prefill in layout.prefills:
            if prefill.positions.shape[1] != prefill.rows.stop - prefill.rows.start:
                raise ValueError("a running-state layer's prefill starts its sequence: no cached prefix precedes it")
            step, state = kernel.decode(*(tensor[prefill.rows].transpose(0, 1).unsqueeze(0)
                                          for tensor in (queries, keys, values)), None, None)  # (1, H, T, Dh)
            out[prefill.rows] = step[0].transpose(0, 1)
            self.write(torch.tensor([prefill.state_slot], device=out.device), state)
        return out.transpose(0, 1).unsqueeze(0), None
