"""Cache backends: what an attention layer keeps between decoding steps, and how a step attends over it.

Every backend offers ``attend(kernel, q, k, v, mask)``: it takes the step's new keys and values,
stores what it keeps, and calls the layer's kernel over what the step's queries may see. The
dense ``KVCache`` preallocates every position; the ``RollingKVCache`` keeps a sliding window's last
keys; the ``CrossAttentionCache`` holds what cross-attention projected from the encoder on the first
step. The paged pool (``paged.py``) and Performer's running state (``performer.py``) are backends
too. A kernel names the backend it decodes with (``AttentionKernel.new_cache``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from tformer.nn.attention.mask import AttentionMask

# A layer's attention kernel, as a backend calls it: (q, k, v, mask, need_weights=) -> (out, weights or None).
Kernel = Callable[..., tuple[Tensor, Tensor | None]]


class KVCache:
    """Preallocated keys and values of one attention layer, filled as decoding proceeds.

    Holds only the key/value heads, so grouped- and multi-query models cache less.
    """

    start = 0  # index of the first key ``append`` returns (a rolling cache forgets the oldest)
    rewindable = True  # ``length`` may be set back (speculative decoding forgets rejected drafts)

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch_size, num_kv_heads, max_len, head_dim)  # (B, Hkv, Tmax, Dh)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.keys.shape[2]

    def attend(self, kernel: Kernel, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Store the step's keys and values (B, Hkv, T, Dh); the kernel's output over every cached key."""
        past = self.length
        end = past + k.shape[2]
        if end > self.keys.shape[2]:
            raise ValueError(f"KV cache overflow: {end} positions exceed its length {self.max_len}")
        self.keys.narrow(2, past, end - past).copy_(k)
        self.values.narrow(2, past, end - past).copy_(v)
        self.length = end
        return kernel(q, self.keys.narrow(2, 0, end), self.values.narrow(2, 0, end), mask, need_weights=need_weights)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (B, Hkv, T, Dh); return all cached so far (views, no copy)."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions exceed its length {self.max_len}")
        self.keys[:, :, self.length:end] = k
        self.values[:, :, self.length:end] = v
        self.length = end
        return self.cached()

    def cached(self) -> tuple[Tensor, Tensor]:
        """Everything cached so far (views): (B, Hkv, length, Dh) each."""
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def reorder(self, batch_indices: Tensor) -> None:
        """Keep the rows named by ``batch_indices`` (beam search), in that order: in place over the filled
        positions when the batch keeps its size, else into new storage."""
        if batch_indices.shape[0] != self.keys.shape[0]:
            self.keys = self.keys.index_select(0, batch_indices)
            self.values = self.values.index_select(0, batch_indices)
            return
        filled = slice(0, self._filled())
        targets = torch.arange(batch_indices.shape[0], device=batch_indices.device)
        if self.keys.device.type == "cpu":  # only the rows that change (a beam keeping its row moves nothing)
            targets = (batch_indices != targets).nonzero().squeeze(1)  # (moved,): a host sync, cheap on the CPU
            batch_indices = batch_indices.index_select(0, targets)
        for cache in (self.keys, self.values):
            part = cache[:, :, filled]
            part.index_copy_(0, targets, part.index_select(0, batch_indices))  # sources read before any write

    def _filled(self) -> int:
        return self.length

    def grow(self, max_len: int) -> None:
        """Make room for ``max_len`` positions, keeping what is cached (the filled part is copied)."""
        if max_len <= self.max_len:
            return
        batch, kv_heads, _, head_dim = self.keys.shape
        keys = self.keys.new_empty(batch, kv_heads, max_len, head_dim)
        values = self.values.new_empty(batch, kv_heads, max_len, head_dim)
        keys[:, :, : self.length] = self.keys[:, :, : self.length]
        values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = keys, values

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class StaticKVCache(KVCache):
    """A ``KVCache`` whose one-token steps keep the same shapes and addresses from step to step, so that a compiled
    step can be captured once and replayed (``cache_implementation="static"``: ``StaticSession``, in
    ``generation/session.py``).

    While ``whole`` is set, a step writes its keys at ``write_index`` (a (1,) tensor the session moves on in place)
    and its kernel reads the whole buffer (B, Hkv, Tmax, Dh), the step's mask hiding the positions not written yet
    (the buffer starts zeroed: a hidden position contributes an exact 0, never a NaN). Otherwise (a prompt, a draft
    verified) it is the plain ``KVCache`` over the same buffers."""

    def __init__(self, keys: Tensor, values: Tensor, write_index: Tensor, captured: bool = False) -> None:
        self.keys, self.values = keys.zero_(), values.zero_()  # (B, Hkv, Tmax, Dh) each
        self.length = 0
        self.write_index = write_index  # (1,) int64: the column this step's key goes to
        self.whole = False
        self.captured = captured  # read by a captured step: its buffers' addresses are part of the capture
        self._mark_static()

    def _mark_static(self) -> None:
        """Tell a captured step that these buffers keep their addresses (a CUDA graph may then write them in
        place; it copies any other input in)."""
        if self.captured:
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)

    def reorder(self, batch_indices: Tensor) -> None:
        resized = batch_indices.shape[0] != self.keys.shape[0]
        super().reorder(batch_indices)
        if resized:  # new buffers (beam search's first step)
            self._mark_static()

    def attend(self, kernel: Kernel, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if not self.whole:
            return super().attend(kernel, q, k, v, mask, need_weights=need_weights)
        self.keys.index_copy_(2, self.write_index, k)
        self.values.index_copy_(2, self.write_index, v)
        return kernel(q, self.keys, self.values, mask, need_weights=need_weights)

    def grow(self, max_len: int) -> None:
        if max_len > self.max_len:
            raise ValueError(f"a static key/value cache holds {self.max_len} positions and never grows; "
                             f"{max_len} were asked for")


# (each layer's buffer shape, dtype, device) -> the key/value buffers of an ended set of captured static caches, for
# the next set of that shape: a CUDA graph is captured over its buffers' addresses, and new buffers at every call
# would make it record again (PyTorch stops capturing after cudagraph_unexpected_rerecord_limit records). One a shape.
_FREE_BUFFERS: dict[tuple, list[tuple[Tensor, Tensor]]] = {}


def static_caches(caches: list, write_index: Tensor, captured: bool) -> list:
    """``caches`` (one ``LayerCache`` a layer, as a stack makes them) with every self-attention cache a
    ``StaticKVCache`` writing at ``write_index`` (B, Hkv, Tmax, Dh buffers each); a ValueError naming a layer's cache
    that cannot be one (a sliding window's, Performer's). ``captured``: read by a captured step, so the buffers of an
    ended set of this shape are taken when there is one, and given back when this set is gone."""
    for layer in caches:
        if type(layer.self_attention) is not KVCache:
            raise ValueError(f"cache_implementation='static' needs a full key/value cache in every layer, and a layer "
                             f"keeps a {type(layer.self_attention).__name__} (a sliding window's or Performer's "
                             "attention kernel); use cache_implementation='dynamic'")
    buffers = [(layer.self_attention.keys, layer.self_attention.values) for layer in caches]
    if captured:
        shape = (tuple(keys.shape for keys, _ in buffers), buffers[0][0].dtype, buffers[0][0].device)
        buffers = _FREE_BUFFERS.pop(shape, buffers)
        weakref.finalize(write_index, _FREE_BUFFERS.setdefault, shape, buffers)  # the set lives as long as it
    for layer, (keys, values) in zip(caches, buffers, strict=True):
        layer.self_attention = StaticKVCache(keys, values, write_index, captured)
    return caches


class RollingKVCache(KVCache):
    """The keys and values of a sliding window's last positions only: ``keep`` of them (the window W, plus
    some so that speculative decoding can take back rejected drafts), in a buffer with ``HEADROOM`` more
    (fewer when ``max_len``, the most positions it will see, is smaller).

    A query sees itself and the W previous positions, so W cached positions are all a step needs. New
    keys are written after the held ones, in place; when the buffer is full, the last ``keep`` are moved
    to its front first (once every ``HEADROOM`` one-token steps). ``append`` returns views of the keys the
    new queries can see (B, Hkv, up to W + T, Dh), whose first index in the sequence is ``start``. Rotary
    angles are applied before caching, so only the order matters. ``length`` counts every position seen;
    it can be set back only to a position whose window is still held.
    """

    HEADROOM = 64  # one-token steps between two moves of the kept positions to the buffer's front

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        keep: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        window: int | None = None,
        max_len: int | None = None,
    ) -> None:
        self._length = 0
        room = keep + self.HEADROOM if max_len is None else max(keep, min(keep + self.HEADROOM, max_len))
        super().__init__(batch_size, num_kv_heads, room, head_dim, dtype, device)
        self.keep = keep
        self.window = keep if window is None else window  # W: what the next query must still see
        self.held = 0  # positions cached now: the last ``held`` of the ``length`` seen
        self.start = 0

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        """Set back to ``value`` tokens (rejected drafts): the positions held after it still cover the window
        the next query reads, or it is refused."""
        if value == self._length:
            return
        held = self.held - (self._length - value)
        if not (0 <= value <= self._length and held >= min(value, self.window)):
            raise ValueError(f"a rolling key/value cache holds positions {self._length - self.held} to "
                             f"{self._length - 1}; it cannot go back to {value} tokens and still see the "
                             f"{self.window} before them (attention_kernel='sliding_window' keeps its window and "
                             f"{self.keep - self.window} more)")
        self._length, self.held = value, held

    def _filled(self) -> int:
        return self.held

    def attend(self, kernel: Kernel, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        keys, values = self.append(k, v)
        return kernel(q, keys, values, mask.shifted(self.start), need_weights=need_weights)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, Hkv, T, Dh); return those the new queries can see, the held ones from
        W before the first new position, then the new ones (views of the buffer, or a copy when T does not
        fit in it)."""
        new, room = k.shape[2], self.keys.shape[2]
        if self.held + new > room:
            self._keep_last()
        held = self.held
        first = max(0, held - self.window)  # the oldest key the first new query sees
        if held + new <= room:
            self.keys[:, :, held:held + new] = k
            self.values[:, :, held:held + new] = v
            keys, values = self.keys[:, :, first:held + new], self.values[:, :, first:held + new]
            self.held = held + new
        else:  # a prompt longer than the buffer: the visible keys are a copy, the last ``keep`` stay
            keys = torch.cat([self.keys[:, :, first:held], k], dim=2)
            values = torch.cat([self.values[:, :, first:held], v], dim=2)
            self.held = min(self.keep, keys.shape[2])
            self.keys[:, :, :self.held] = keys[:, :, -self.held:]
            self.values[:, :, :self.held] = values[:, :, -self.held:]
        self.start = self._length - (held - first)
        self._length += new
        return keys, values

    def _keep_last(self) -> None:
        """Move the last ``keep`` held positions to the front of the buffer (the rest are forgotten)."""
        kept = min(self.keep, self.held)
        if kept and self.held > kept:
            self.keys[:, :, :kept] = self.keys[:, :, self.held - kept:self.held].clone()
            self.values[:, :, :kept] = self.values[:, :, self.held - kept:self.held].clone()
        self.held = kept

    def cached(self) -> tuple[Tensor, Tensor]:
        return self.keys[:, :, :self.held], self.values[:, :, :self.held]

    def grow(self, max_len: int) -> None:
        """Nothing to do: a window's cache never needs more room."""


class CrossAttentionCache:
    """The keys and values cross-attention projects from the encoder's output (B, Hkv, S, Dh): stored by
    the first decoding step, read by every later one (the source does not change while decoding).

    Beams of one source share its keys: a step may bring ``g`` times more query rows than the cache holds
    sources, query row ``r`` reading source ``r // g`` (a session groups a source's beams together). The ``g``
    queries of a source then attend as one block of ``g * T`` queries over its keys, read once for all."""

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    @property
    def filled(self) -> bool:
        return self.keys is not None

    def attend(self, kernel: Kernel, q: Tensor, k: Tensor | None, v: Tensor | None, mask: AttentionMask,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if k is not None:
            self.keys, self.values = k, v
        sources, rows = self.keys.shape[0], q.shape[0]
        if rows == sources:
            return kernel(q, self.keys, self.values, mask, need_weights=need_weights)
        if rows % sources:
            raise ValueError(f"{rows} query rows cannot share the cross-attention keys of {sources} sources "
                             "(each source needs the same number of rows)")
        group = rows // sources
        _, heads, length, head_dim = q.shape
        grouped = q.view(sources, group, heads, length, head_dim).transpose(1, 2)  # (B, H, g, T, Dh)
        out, weights = kernel(grouped.reshape(sources, heads, group * length, head_dim), self.keys, self.values,
                              mask, need_weights=need_weights)
        out = out.view(sources, heads, group, length, head_dim).transpose(1, 2).reshape(rows, heads, length, head_dim)
        if weights is not None:  # (B, H, g * T, S) -> (B * g, H, T, S)
            weights = weights.view(sources, heads, group, length, -1).transpose(1, 2).reshape(rows, heads, length, -1)
        return out, weights

    def reorder(self, batch_indices: Tensor) -> None:
        """Keep the sources named by ``batch_indices`` (B',), in that order, repeating as asked."""
        if self.filled:
            self.keys = self.keys.index_select(0, batch_indices)
            self.values = self.values.index_select(0, batch_indices)

    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes
