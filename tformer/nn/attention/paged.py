"""Attention over a paged key/value cache: the layout of a step that decodes many sequences at once, each sequence's
keys and values in the slots of one shared storage that its block table hands out (the blocks, the tables and
prefix caching are the serving engine's: ``tformer.serving.block_pool``).

A paged step mixes sequences that decode one token with sequences whose prompt is prefilled: every new token is one
row of the step (the model runs them as one batch of N rows), so projections and feed-forward layers are single
matrix products over all of them; only attention is grouped (``PagedCache``): the one-token sequences attend
together over their slots, gathered into one left-padded batch, and each prefill attends alone, causal over its
context. The kernel is the model's own, whichever it is, under an ``AttentionMask`` per group. A layout built
``in_place`` instead lists the one-token sequences' slots back to back (no padding) for an in-place reader
(``paged_kernel.py``: the C++ kernel, or FlexAttention on a GPU), which reads them where they are. A layer that
keeps a running state per sequence instead of keys (Performer's ``RunningSums``) reads each sequence's
``state_slot`` of the step, and so does cross-attention (``PagedCrossCache``): each sequence's encoder keys, stored
by its first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from tformer.nn.attention.cache import Kernel
from tformer.nn.attention.mask import AttentionMask, PositionBias, StepLayout
from tformer.nn.attention.paged_kernel import flex_paged_decode, paged_block_mask, paged_decode


class SlotTable(Protocol):
    """What a paged step reads of a sequence's block table: how many tokens it stores, and their slots."""

    length: int

    def slots(self, start: int, end: int) -> Tensor:
        """Storage rows (end - start,) of positions ``start`` .. ``end - 1``."""

    def last_slot(self) -> int:
        """The storage row of its last stored token."""


@dataclass
class PagedPrefill:
    """A sequence of a paged step that runs several new tokens (a prompt): its rows and context."""

    rows: slice  # its new tokens' rows in the step
    context: Tensor  # (L,) slots of all its tokens, in order
    positions: Tensor  # (1, L) their positions
    state_slot: int = -1  # its row of a running-state layer's storage (-1: the engine keeps no states)

    @property
    def query_positions(self) -> Tensor:
        """(1, T) the positions of its new tokens: the last T of its context."""
        return self.positions[:, self.positions.shape[1] - (self.rows.stop - self.rows.start):]


@dataclass(eq=False)
class PagedLayout(StepLayout):
    """One step over a paged storage: every sequence's new tokens as the rows of one batch (1, N), where
    their keys and values go, and what each group of rows attends over. ``keep``: the rows whose logits the
    step returns: each sequence's last new row, or every new row of a sequence whose prompt is scored."""

    slots: Tensor = field(default=None)  # (N,) pool rows of the new keys and values
    decode_rows: Tensor | None = None  # (Bd,) rows of the sequences adding one token
    decode_context: Tensor | None = None  # (Bd, Lmax) their slots, left-padded with slot 0; in place: (N,) flat
    decode_padding: Tensor | None = None  # (Bd, Lmax) True = a real key; None when every context is Lmax long
    decode_positions: Tensor | None = None  # (Bd, Lmax) key positions (negative on the padding)
    decode_offsets: Tensor | None = None  # in place: (Bd + 1,) where each sequence's slots start in decode_context (N,)
    in_place: str | None = None  # the in-place reader ("kernel", "flex"; paged_kernel.READERS), None: a gather
    block_size: int = 0  # in place through FlexAttention: the pool's block size, which its mask reads
    decode_state_slots: Tensor | None = None  # (Bd,) their rows of a running-state layer's storage
    source_slots: list[int] = field(default_factory=list)  # the rows whose sources the step's encoder output brings
    prefills: list[PagedPrefill] = field(default_factory=list)

    @classmethod
    def build(cls, tables: Sequence[SlotTable], new_tokens: list[int], device: torch.device,
              every_row: list[bool] | None = None, in_place: str | None = None, block_size: int = 0,
              state_slots: Sequence[int] | None = None) -> PagedLayout:
        """The layout for sequences whose ``tables`` already hold room for their ``new_tokens`` (a count each);
        ``every_row``: the sequences whose every new row the step keeps (a prompt whose log-probabilities are
        asked for), not only the last (None: none); ``in_place``: the one-token sequences' slots for this
        in-place reader, not a padded batch (``block_size``: the pool's, which FlexAttention's mask reads);
        ``state_slots``: each sequence's row of a running-state layer's storage (None: the model has no such
        layer). A sequence's first step is a prefill, even of one token."""
        positions, slots, kept_rows, decode_rows, decode_contexts, prefills = [], [], [], [], [], []
        every_row = every_row or [False] * len(tables)
        keeps_states = state_slots is not None
        state_slots = state_slots if keeps_states else [-1] * len(tables)
        decode_states, decode_lengths = [], []
        row = 0
        for table, count, whole, state in zip(tables, new_tokens, every_row, state_slots, strict=True):
            context = table.slots(0, table.length)  # (L,)
            positions.extend(range(table.length - count, table.length))
            if count == 1 and table.length > 1:
                slots.append(table.last_slot())
                decode_rows.append(row)
                decode_contexts.append(context)
                decode_lengths.append(table.length)
                decode_states.append(state)
            else:
                slots.extend(context[-count:].tolist())
                prefills.append(PagedPrefill(slice(row, row + count), on_device(context, device),
                                             torch.arange(table.length, device=device)[None], state))
            kept_rows.extend(range(row, row + count) if whole else [row + count - 1])
            row += count
        layout = cls(on_device([positions], device), real_queries=True, keep=on_device(kept_rows, device),
                     slots=on_device(slots, device), prefills=prefills)
        if decode_contexts and keeps_states:
            layout.decode_state_slots = on_device(decode_states, device)
        if decode_contexts and in_place:
            layout.decode_rows = on_device(decode_rows, device)
            layout.decode_context = on_device(torch.cat(decode_contexts), device)
            layout.decode_offsets = on_device(torch.tensor([0] + decode_lengths).cumsum(0), device)
            layout.in_place, layout.block_size = in_place, block_size
        elif decode_contexts:
            layout._lay_out_decodes(decode_rows, decode_contexts, decode_lengths, device)
        return layout

    @classmethod
    def decoding(cls, tables: Sequence[SlotTable], device: torch.device, rows: int, length: int,
                 filler_slot: int) -> PagedLayout:
        """A step in which every sequence of ``tables`` adds one token (their slots appended), laid out at a fixed
        shape, as a captured step is replayed: ``rows`` rows (those past the sequences read and write only
        ``filler_slot``, a slot no sequence holds) over contexts of ``length`` slots (at least the longest)."""
        contexts = [table.slots(0, table.length) for table in tables]
        contexts += [torch.tensor([filler_slot])] * (rows - len(contexts))
        layout = cls(None, real_queries=True)
        lengths = [table.length for table in tables] + [1] * (rows - len(tables))
        layout._lay_out_decodes(list(range(rows)), contexts, lengths, device, length=length, filler_slot=filler_slot)
        layout.positions = layout.decode_positions[:, -1][None]  # (1, rows): each new token is its context's last
        layout.slots = layout.decode_context[:, -1]  # (rows,) where its key and value go
        return layout

    def _lay_out_decodes(self, rows: list[int], contexts: list[Tensor], sizes: list[int], device: torch.device,
                         length: int | None = None, filler_slot: int = 0) -> None:
        """The one-token sequences' contexts (``sizes`` slots each) as one left-padded batch (to ``length`` slots,
        else the longest context's, the padding ``filler_slot``): each query is the last position of its row, so
        causality, a sliding window and position biases read the same as for one sequence."""
        longest = max(sizes) if length is None else length
        padded = torch.full((len(contexts), longest), filler_slot, dtype=torch.long)
        for index, (context, size) in enumerate(zip(contexts, sizes, strict=True)):
            padded[index, longest - size:] = context
        lengths = torch.tensor(sizes)
        self.decode_rows = on_device(rows, device)
        self.decode_context = on_device(padded, device)
        self.decode_positions = on_device(torch.arange(longest)[None, :] - (longest - lengths)[:, None], device)
        if length is not None or min(sizes) < longest:  # a fixed shape: padding whether or not needed
            self.decode_padding = self.decode_positions >= 0

    def attention_mask(self, causal: bool, position_bias: PositionBias | None) -> PagedMask:
        if not causal:
            raise ValueError("a paged step decodes: its attention is causal")
        return PagedMask(self, position_bias)

    def encoder_mask(self, encoder_padding: Tensor | None) -> PagedCrossMask:
        lengths = None if encoder_padding is None else encoder_padding.sum(-1).tolist()
        return PagedCrossMask(self, lengths)


@dataclass
class PagedCrossMask:
    """Cross-attention's mask in a paged step, built once for every layer: the layout (whose rows read which
    sequence's source) and the real length of each new source the step's encoder output brings, right-padded (None:
    none padded)."""

    layout: PagedLayout
    new_lengths: list[int] | None


class PagedMask:
    """The mask of a paged step: an ``AttentionMask`` for the one-token sequences together, and one per
    prefill, built once per step and read by every layer's ``PagedCache``."""

    def __init__(self, layout: PagedLayout, position_bias: PositionBias | None) -> None:
        self.layout = layout
        self.decode = None
        self.block_mask = None  # in place through FlexAttention: the step's block mask, made by its first layer
        if layout.decode_offsets is not None and position_bias is not None:
            raise ValueError("the in-place paged kernel adds no position bias: gather for this model")
        if layout.decode_rows is not None and layout.decode_offsets is None:
            queries = layout.decode_positions[:, -1:]  # (Bd, 1) each query is its context's last position
            self.decode = AttentionMask(True, layout.decode_padding, queries, layout.decode_positions, position_bias,
                                        real_queries=True)
        self.prefills = [AttentionMask(True, None, prefill.query_positions, prefill.positions, position_bias,
                                       real_queries=True) for prefill in layout.prefills]


class PagedCache:
    """One layer's paged storage, as a cache backend: a paged step's new keys and values go to their slots,
    then each group of rows attends over its sequences' slots with the kernel (gathered), or, the one-token
    sequences of an in-place layout, with the in-place kernel (read where they are)."""

    rewindable = False

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.keys, self.values = keys, values  # (slots, Hkv, Dh): the layer's rows of the engine's pool

    def attend(self, kernel: Kernel, q: Tensor, k: Tensor, v: Tensor, mask: PagedMask,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """q (1, H, N, Dh), k and v (1, Hkv, N, Dh): the step's rows -> (1, H, N, Dh)."""
        if need_weights:
            raise ValueError("a paged step returns no attention weights")
        layout = mask.layout
        keys, values = self.keys, self.values  # (slots, Hkv, Dh)
        keys.index_copy_(0, layout.slots, k[0].transpose(0, 1))
        values.index_copy_(0, layout.slots, v[0].transpose(0, 1))
        rows = q[0].transpose(0, 1)  # (N, H, Dh)
        kv_heads, head_dim = keys.shape[1], keys.shape[2]
        if layout.decode_offsets is not None:  # in place: the reader takes the pool's rows where they are
            if not layout.prefills:
                out = read_in_place(rows, keys, values, mask)  # (N, H, Dh)
                return out.transpose(0, 1).unsqueeze(0), None
            out = torch.empty_like(rows)
            out[layout.decode_rows] = read_in_place(rows[layout.decode_rows], keys, values, mask)
        elif layout.decode_rows is not None:
            batch, longest = layout.decode_context.shape
            flat = layout.decode_context.view(-1)  # index_select gathers rows faster than indexing by a 2-D tensor
            context_keys = keys.index_select(0, flat).view(batch, longest, kv_heads, head_dim).transpose(1, 2)
            context_values = values.index_select(0, flat).view(batch, longest, kv_heads, head_dim).transpose(1, 2)
            if not layout.prefills:  # every row decodes one token, in order: no gather, no scatter
                out = kernel(rows.unsqueeze(2), context_keys, context_values, mask.decode)[0]  # (N, H, 1, Dh)
                return out.squeeze(2).transpose(0, 1).unsqueeze(0), None
            out = torch.empty_like(rows)
            queries = rows[layout.decode_rows].unsqueeze(2)  # (Bd, H, 1, Dh)
            out[layout.decode_rows] = kernel(queries, context_keys, context_values, mask.decode)[0].squeeze(2)
        else:
            out = torch.empty_like(rows)
        for prefill, prefill_mask in zip(layout.prefills, mask.prefills, strict=True):
            queries = rows[prefill.rows].transpose(0, 1).unsqueeze(0)  # (1, H, T, Dh)
            context_keys = keys.index_select(0, prefill.context).transpose(0, 1).unsqueeze(0)  # (1, Hkv, L, Dh)
            context_values = values.index_select(0, prefill.context).transpose(0, 1).unsqueeze(0)
            out[prefill.rows] = kernel(queries, context_keys, context_values, prefill_mask)[0][0].transpose(0, 1)
        return out.transpose(0, 1).unsqueeze(0), None


def on_device(values: Tensor | list, device: torch.device) -> Tensor:
    """Host ``values`` (a tensor, or a list of integers) on ``device``. On a GPU the copy leaves from pinned memory
    without waiting: a blocking copy waits for every kernel queued before it, and the serving engine lays out a step
    while the step before runs (``serving/overlapped_steps.py``)."""
    host = values if isinstance(values, Tensor) else torch.tensor(values)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def read_in_place(queries: Tensor, keys: Tensor, values: Tensor, mask: PagedMask) -> Tensor:
    """The one-token sequences' attention, queries (Bd, H, Dh), over their slots of one layer's pool (slots, Hkv,
    Dh) where they are, by the layout's in-place reader -> (Bd, H, Dh)."""
    layout = mask.layout
    if layout.in_place != "flex":
        return paged_decode(queries, keys, values, layout.decode_context, layout.decode_offsets)
    if mask.block_mask is None:
        mask.block_mask = paged_block_mask(layout.decode_context, layout.decode_offsets, layout.block_size,
                                           keys.shape[0])
    return flex_paged_decode(queries, keys, values, mask.block_mask)


class PagedCrossCache:
    """One cross-attention layer's keys and values of the encoder's output, one row per running sequence (its
    ``state_slot``; the sequences of one source may share one), as a cache backend of a paged step: the step's new
    sources are projected by the layer and stored in their rows of one zero-padded tensor
    (``PagedLayout.source_slots``); the one-token sequences then attend together over the range of rows they hold,
    read where they lie (a row in that range that no one-token sequence reads gets a query of zeros, its output
    dropped), or, where sequences share a row (a request's beams), over their rows gathered; each prefill alone over
    its own. Under continuous batching the decoding rows change at most steps: stacking them anew each time cost a
    sixth of a small speech model's decoder step."""

    rewindable = False
    filled = False  # every step brings the sources of the sequences it starts (maybe none): the layer projects them

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.keys: Tensor | None = None  # (rows so far, Hkv, S, Dh): each row's source, then zeros or an older one's
        self.values: Tensor | None = None
        self.lengths = [0] * rows  # each row's source length
        # Rows shared by beams, gathered for the last step: (their rows, keys, values, mask), kept while the same
        # rows decode and no source is stored.
        self._gathered: tuple[tuple[int, ...], Tensor, Tensor, AttentionMask] | None = None

    def attend(self, kernel: Kernel, q: Tensor, k: Tensor, v: Tensor, mask: PagedCrossMask,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """q (1, H, N, Dh): the step's rows; k and v (B, Hkv, S, Dh): the new sources' -> (1, H, N, Dh)."""
        if need_weights:
            raise ValueError("a paged step returns no attention weights")
        layout = mask.layout
        for index, slot in enumerate(layout.source_slots):
            length = k.shape[2] if mask.new_lengths is None else mask.new_lengths[index]
            self._store(slot, k[index, :, :length], v[index, :, :length])
        rows = q[0].transpose(0, 1)  # (N, H, Dh)
        out = torch.empty_like(rows)
        if layout.decode_rows is not None:
            queries = rows[layout.decode_rows].unsqueeze(2)  # (Bd, H, 1, Dh)
            out[layout.decode_rows] = self._decode(kernel, queries, layout.decode_state_slots)
        for prefill in layout.prefills:
            queries = rows[prefill.rows].transpose(0, 1).unsqueeze(0)  # (1, H, T, Dh)
            slot, length = prefill.state_slot, self.lengths[prefill.state_slot]
            keys, values = self.keys[slot:slot + 1, :, :length], self.values[slot:slot + 1, :, :length]
            out[prefill.rows] = kernel(queries, keys, values, AttentionMask())[0][0].transpose(0, 1)
        return out.transpose(0, 1).unsqueeze(0), None

    def _store(self, slot: int, keys: Tensor, values: Tensor) -> None:
        """Row ``slot``'s new source: keys and values (Hkv, L, Dh), the storage grown to hold them."""
        length = keys.shape[1]
        if self.keys is None or slot >= self.keys.shape[0] or length > self.keys.shape[2]:
            held = 0 if self.keys is None else self.keys.shape[0]
            rows = min(self.rows, max(slot + 1, 2 * held))
            longest = max(length, 0 if self.keys is None else self.keys.shape[2])
            self.keys, self.values = (self._grown(old, new, rows, longest)
                                      for old, new in ((self.keys, keys), (self.values, values)))
        self.keys[slot, :, :length] = keys
        self.values[slot, :, :length] = values
        self.lengths[slot] = length
        self._gathered = None

    @staticmethod
    def _grown(old: Tensor | None, like: Tensor, rows: int, longest: int) -> Tensor:
        """Zeros (rows, Hkv, longest, Dh) of ``like``'s kind, ``old`` copied into its corner."""
        grown = like.new_zeros(rows, like.shape[0], longest, like.shape[2])
        if old is not None:
            grown[: old.shape[0], :, : old.shape[2]] = old
        return grown

    def _decode(self, kernel: Kernel, queries: Tensor, slots: Tensor) -> Tensor:
        """The one-token sequences' queries (Bd, H, 1, Dh), each over the source of its row ``slots`` (Bd,) ->
        (Bd, H, Dh)."""
        listed = slots.tolist()
        longest = max(self.lengths[slot] for slot in listed)
        if len(set(listed)) < len(listed):  # rows shared (beams): each sequence its row, gathered
            if self._gathered is None or self._gathered[0] != tuple(listed):
                lengths = [self.lengths[slot] for slot in listed]
                self._gathered = (tuple(listed), self.keys[:, :, :longest].index_select(0, slots),
                                  self.values[:, :, :longest].index_select(0, slots),
                                  self._padding(lengths, longest, queries.device))
            return kernel(queries, *self._gathered[1:])[0].squeeze(2)
        low, high = min(listed), max(listed) + 1
        placed = queries.new_zeros(high - low, *queries.shape[1:])  # (rows in the range, H, 1, Dh)
        places = slots - low
        placed[places] = queries
        # A row no one-token sequence reads (free, or prefilling now) attends over at least one key: finite, dropped.
        lengths = [max(1, self.lengths[slot]) for slot in range(low, high)]
        keys, values = self.keys[low:high, :, :longest], self.values[low:high, :, :longest]
        out = kernel(placed, keys, values, self._padding(lengths, longest, queries.device))[0]
        return out[places].squeeze(2)

    @staticmethod
    def _padding(lengths: list[int], longest: int, device: torch.device) -> AttentionMask:
        """The mask of rows of ``lengths`` keys within ``longest`` (none where every row reaches it)."""
        if min(lengths) >= longest:
            return AttentionMask()
        real = torch.tensor(lengths, device=device)
        return AttentionMask(key_padding=torch.arange(longest, device=device)[None, :] < real[:, None])
