"""The paged cache backend: keys and values in fixed-size blocks from one pool that every sequence
shares, each sequence reaching its own through a block table (PagedAttention's layout, Kwon et al.
2023), and the layout of a step that decodes many sequences at once over it.

Why pages: a preallocated (B, Hkv, Tmax, Dh) cache holds the longest answer's room for every
request; blocks are taken as tokens arrive and given back the moment a request ends, so the
memory held follows the tokens actually stored (at most one part-filled block per sequence).

Admission reserves, allocation draws: a request is admitted only when the pool can promise it
the blocks of its prompt plus its longest answer (``reserve``); blocks are then allocated one at
a time from that promise as the sequence grows. A running sequence therefore never finds the
pool empty, and a full pool makes new requests wait instead of corrupting running ones.

Prefix caching: a full block of a prompt is named by its content, a digest of the previous block's
name and its own token ids (``prefix_keys``), so a name stands for the whole prefix up to the block's
end. The pool maps names to blocks and counts each block's references (the block tables holding it).
A new sequence whose prompt starts with named blocks takes them instead of computing them again; a
shared block is full, so no sequence ever writes into it. A named block that nobody references keeps
its keys and values, in a least-recently-used order, until the pool needs room for a new block: such
blocks count as available, so the reservations stay exact, and only they are ever evicted.

A paged step mixes sequences that decode one token with sequences whose prompt is prefilled: every
new token is one row of the step (the model runs them as one batch of N rows), so projections and
feed-forward layers are single matrix products over all of them; only attention is grouped
(``PagedCache``): the one-token sequences attend together over their slots, gathered into one
left-padded batch, and each prefill attends alone, causal over its context. The kernel is the
model's own, whichever it is, under an ``AttentionMask`` per group. A layout built ``in_place`` instead
lists the one-token sequences' slots back to back (no padding) for the in-place kernel
(``paged_kernel.py``), which reads them where they are.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tformer.nn.attention.cache import Kernel
from tformer.nn.attention.mask import AttentionMask, PositionBias, StepLayout
from tformer.nn.attention.paged_kernel import paged_decode


def blocks_for(tokens: int, block_size: int) -> int:
    """How many blocks of ``block_size`` hold ``tokens`` tokens."""
    return -(-tokens // block_size)


def prefix_keys(token_ids: Sequence[int], block_size: int, salt: bytes = b"") -> list[bytes]:
    """The content key of each full block of ``token_ids``: a SHA-256 digest of the previous block's key
    and this block's ids. A block's keys and values depend on every token before it, so a key names the
    whole prefix; equal keys mean equal prefixes (a collision is as likely as one of SHA-256's). ``salt`` stands
    before the first block: what else the keys and values depend on (a served LoRA adapter's name), so equal
    prefixes computed differently never share blocks."""
    keys, previous = [], salt
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        digest = hashlib.sha256(previous)
        digest.update(array("q", token_ids[start : start + block_size]).tobytes())
        previous = digest.digest()
        keys.append(previous)
    return keys


class BlockPool:
    """Keys and values of every layer in ``num_blocks`` blocks of ``block_size`` token slots.

    Storage is slot-major, (layers, num_blocks * block_size, Hkv, Dh): token slot ``s`` of
    block ``b`` is row ``b * block_size + s``, so writing a step's keys is one ``index_copy_`` and
    reading a sequence's is one gather by its slots.

    A block is free, referenced by one or more block tables, or cached: named by its content
    (``register``) and referenced by no table, kept for a later prompt with the same prefix until
    ``allocate`` needs its room (least recently used first).
    """

    def __init__(self, num_blocks: int, block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a block pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)  # (L, slots, Hkv, Dh)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: the lowest id is handed out first
        self._references = [0] * num_blocks  # block tables holding each block
        self._cached: OrderedDict[int, None] = OrderedDict()  # named blocks nobody holds, least recently used first
        self._block_named: dict[bytes, int] = {}  # content key -> block
        self._name_of: dict[int, bytes] = {}  # block -> content key
        self.reserved = 0  # blocks promised to admitted sequences and not yet allocated

    @property
    def blocks_in_use(self) -> int:
        """Blocks some block table holds."""
        return self.num_blocks - len(self._free) - len(self._cached)

    @property
    def cached_blocks(self) -> int:
        """Blocks nobody holds that keep their keys and values for the prefix cache."""
        return len(self._cached)

    @property
    def available(self) -> int:
        """Blocks neither held nor promised: the free ones and the cached ones (evicted when needed)."""
        return len(self._free) + len(self._cached) - self.reserved

    def references(self, block: int) -> int:
        """How many block tables hold ``block``."""
        return self._references[block]

    def bytes_per_block(self) -> int:
        return 2 * self.keys[:, : self.block_size].nbytes

    def lookup(self, keys: Sequence[bytes]) -> list[int]:
        """The blocks of the longest run of ``keys`` (from the first) that the pool holds, in order."""
        blocks = []
        for key in keys:
            block = self._block_named.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def reserve(self, count: int, shared: Sequence[int] = ()) -> bool:
        """Promise ``count`` new blocks to a sequence that starts with the ``shared`` blocks (from ``lookup``),
        and take a reference to each of those; False (nothing promised or taken) when the pool cannot. A
        shared block nobody held leaves the cache, so it counts against what is available."""
        revived = sum(1 for block in shared if self._references[block] == 0)
        if count + revived > self.available:
            return False
        for block in shared:
            if self._references[block] == 0:
                del self._cached[block]
            self._references[block] += 1
        self.reserved += count
        return True

    def share(self, blocks: Sequence[int]) -> list[int]:
        """One more reference to each of ``blocks``, which a table already holds (a sibling sequence's copy)."""
        for block in blocks:
            if self._references[block] < 1:
                raise RuntimeError(f"block {block} is shared while no table holds it")
            self._references[block] += 1
        return list(blocks)

    def allocate(self) -> int:
        """One block out of a promise made by ``reserve``: a free one, else the least recently used cached one
        (its name forgotten)."""
        if self.reserved < 1:
            raise RuntimeError("allocate() without a reservation")
        self.reserved -= 1
        if self._free:
            block = self._free.pop()
        else:  # reservations never exceed free + cached blocks, so one is cached
            block, _ = self._cached.popitem(last=False)
            del self._block_named[self._name_of.pop(block)]
        self._references[block] = 1
        return block

    def register(self, block: int, key: bytes) -> None:
        """Name a full block by its content ``key`` so later prompts find it; a no-op when the key already
        names a block (two prompts computed it in one step) or the block already has its name."""
        if key in self._block_named or block in self._name_of:
            return
        if self._references[block] < 1:
            raise RuntimeError(f"block {block} is registered while no table holds it")
        self._block_named[key] = block
        self._name_of[block] = key

    def copy_tokens(self, source: int, target: int, count: int) -> None:
        """Copy the first ``count`` token slots of block ``source`` into block ``target``, every layer."""
        size = self.block_size
        for storage in (self.keys, self.values):  # (L, slots, Hkv, Dh)
            storage[:, target * size : target * size + count] = storage[:, source * size : source * size + count]

    def release(self, blocks: list[int], unused_reservation: int) -> None:
        """Drop a sequence's references to its ``blocks`` and what it was promised but never allocated. A block
        nobody holds any more is cached when named (its last block first, evicted first: a prefix is found
        only from its first block), else free."""
        self.reserved -= unused_reservation
        for block in reversed(blocks):
            self._references[block] -= 1
            if self._references[block] == 0:
                if block in self._name_of:
                    self._cached[block] = None
                else:
                    self._free.append(block)


class BlockTable:
    """One sequence's blocks in order, the tokens they hold, and its remaining promise.

    ``shared``: full blocks the sequence starts with, whose references the caller has taken (a prefix
    found in the cache, a sibling's prompt); they are read, never written. The pool rows of its tokens are
    kept as they are handed out (``slots``), so a step reads a sequence's context without recomputing it
    from the block list."""

    def __init__(self, pool: BlockPool, reservation: int, shared: Sequence[int] = ()) -> None:
        size = pool.block_size
        self.pool = pool
        self.blocks: list[int] = list(shared)
        self.length = len(self.blocks) * size  # tokens stored
        self.reservation = reservation  # blocks promised and not yet allocated
        self._slots = torch.empty((len(self.blocks) + reservation) * size, dtype=torch.long)  # (capacity,) rows
        if self.blocks:
            self._slots[: self.length] = (torch.tensor(self.blocks)[:, None] * size + torch.arange(size)).view(-1)

    def append_slots(self, count: int) -> Tensor:
        """Slots (count,) for the next ``count`` tokens, taking blocks from the promise as needed."""
        start, end, size = self.length, self.length + count, self.pool.block_size
        if end > self._slots.numel():
            raise RuntimeError(f"sequence grew past its reservation ({len(self.blocks)} blocks)")
        while len(self.blocks) * size < end:
            self.blocks.append(self.pool.allocate())
            self.reservation -= 1
        if count == 1:
            self._slots[start] = self.blocks[start // size] * size + start % size
        else:
            positions = torch.arange(start, end)
            blocks = torch.tensor(self.blocks, dtype=torch.long)[positions // size]
            self._slots[start:end] = blocks * size + positions % size
        self.length = end
        return self._slots[start:end]

    def slots(self, start: int, end: int) -> Tensor:
        """Pool rows of positions ``start`` .. ``end - 1`` (stored tokens only)."""
        if not 0 <= start <= end <= self.length:
            raise IndexError(f"positions {start}..{end - 1} are outside the {self.length} stored tokens")
        return self._slots[start:end]

    def fork(self, reservation: int) -> BlockTable:
        """A table holding the same tokens for a sibling sequence: this one's full blocks shared, its
        part-filled last block copied into the first block of the sibling's own ``reservation``."""
        size = self.pool.block_size
        full = self.length // size
        sibling = BlockTable(self.pool, reservation, self.pool.share(self.blocks[:full]))
        tail = self.length - full * size
        if tail:
            sibling.append_slots(tail)
            self.pool.copy_tokens(self.blocks[full], sibling.blocks[full], tail)
        return sibling

    def release(self) -> None:
        """Give every block and the unused promise back to the pool (idempotent)."""
        self.pool.release(self.blocks, self.reservation)
        self.blocks, self.reservation, self.length = [], 0, 0


@dataclass
class PagedPrefill:
    """A sequence of a paged step that runs several new tokens (a prompt): its rows and context."""

    rows: slice  # its new tokens' rows in the step
    context: Tensor  # (L,) slots of all its tokens, in order
    positions: Tensor  # (1, L) their positions

    @property
    def query_positions(self) -> Tensor:
        """(1, T) the positions of its new tokens: the last T of its context."""
        return self.positions[:, self.positions.shape[1] - (self.rows.stop - self.rows.start):]


@dataclass(eq=False)
class PagedLayout(StepLayout):
    """One step over a ``BlockPool``: every sequence's new tokens as the rows of one batch (1, N), where
    their keys and values go, and what each group of rows attends over. ``keep``: the rows whose logits the
    step returns: each sequence's last new row, or every new row of a sequence whose prompt is scored."""

    slots: Tensor = field(default=None)  # (N,) pool rows of the new keys and values
    decode_rows: Tensor | None = None  # (Bd,) rows of the sequences adding one token
    decode_context: Tensor | None = None  # (Bd, Lmax) their slots, left-padded with slot 0; in place: (N,) flat
    decode_padding: Tensor | None = None  # (Bd, Lmax) True = a real key; None when every context is Lmax long
    decode_positions: Tensor | None = None  # (Bd, Lmax) key positions (negative on the padding)
    decode_offsets: Tensor | None = None  # in place: (Bd + 1,) where each sequence's slots start in decode_context (N,)
    prefills: list[PagedPrefill] = field(default_factory=list)

    @classmethod
    def build(cls, tables: list[BlockTable], new_tokens: list[int], device: torch.device,
              every_row: list[bool] | None = None, in_place: bool = False) -> PagedLayout:
        """The layout for sequences whose ``tables`` already hold room for their ``new_tokens`` (a count each);
        ``every_row``: the sequences whose every new row the step keeps (a prompt whose log-probabilities are
        asked for), not only the last (None: none); ``in_place``: the one-token sequences' slots for the
        in-place kernel, not a padded batch."""
        positions, slots, kept_rows, decode_rows, decode_contexts, prefills = [], [], [], [], [], []
        every_row = every_row or [False] * len(tables)
        row = 0
        for table, count, whole in zip(tables, new_tokens, every_row, strict=True):
            context = table.slots(0, table.length)  # (L,)
            positions.extend(range(table.length - count, table.length))
            slots.append(context[-count:])
            if count == 1:
                decode_rows.append(row)
                decode_contexts.append(context)
            else:
                prefills.append(PagedPrefill(slice(row, row + count), context.to(device),
                                             torch.arange(table.length, device=device)[None]))
            kept_rows.extend(range(row, row + count) if whole else [row + count - 1])
            row += count
        layout = cls(torch.tensor([positions], device=device), real_queries=True,
                     keep=torch.tensor(kept_rows, device=device), slots=torch.cat(slots).to(device),
                     prefills=prefills)
        if decode_contexts and in_place:
            layout.decode_rows = torch.tensor(decode_rows, device=device)
            layout.decode_context = torch.cat(decode_contexts).to(device)
            lengths = torch.tensor([0] + [len(context) for context in decode_contexts])
            layout.decode_offsets = lengths.cumsum(0).to(device)
        elif decode_contexts:
            layout._lay_out_decodes(decode_rows, decode_contexts, device)
        return layout

    def _lay_out_decodes(self, rows: list[int], contexts: list[Tensor], device: torch.device) -> None:
        """The one-token sequences' contexts as one left-padded batch: each query is the last position of
        its row, so causality, a sliding window and position biases read the same as for one sequence."""
        longest = max(len(context) for context in contexts)
        lengths = torch.tensor([len(context) for context in contexts])
        padded = torch.zeros(len(contexts), longest, dtype=torch.long)
        for index, context in enumerate(contexts):
            padded[index, longest - len(context):] = context
        self.decode_rows = torch.tensor(rows, device=device)
        self.decode_context = padded.to(device)
        self.decode_positions = (torch.arange(longest)[None, :] - (longest - lengths)[:, None]).to(device)
        if bool((lengths < longest).any()):
            self.decode_padding = self.decode_positions >= 0

    def attention_mask(self, causal: bool, position_bias: PositionBias | None) -> PagedMask:
        if not causal:
            raise ValueError("a paged step decodes: its attention is causal")
        return PagedMask(self, position_bias)


class PagedMask:
    """The mask of a paged step: an ``AttentionMask`` for the one-token sequences together, and one per
    prefill, built once per step and read by every layer's ``PagedCache``."""

    def __init__(self, layout: PagedLayout, position_bias: PositionBias | None) -> None:
        self.layout = layout
        self.decode = None
        if layout.decode_offsets is not None and position_bias is not None:
            raise ValueError("the in-place paged kernel adds no position bias: gather for this model")
        if layout.decode_rows is not None and layout.decode_offsets is None:
            queries = layout.decode_positions[:, -1:]  # (Bd, 1) each query is its context's last position
            self.decode = AttentionMask(True, layout.decode_padding, queries, layout.decode_positions, position_bias,
                                        real_queries=True)
        self.prefills = [AttentionMask(True, None, prefill.query_positions, prefill.positions, position_bias,
                                       real_queries=True) for prefill in layout.prefills]


class PagedCache:
    """One layer's part of a ``BlockPool``, as a cache backend: a paged step's new keys and values go to
    their slots, then each group of rows attends over its sequences' slots with the kernel (gathered), or, the
    one-token sequences of an in-place layout, with the in-place kernel (read where they are)."""

    rewindable = False

    def __init__(self, pool: BlockPool, layer: int) -> None:
        self.pool = pool
        self.layer = layer
        self.keys, self.values = pool.keys[layer], pool.values[layer]  # (slots, Hkv, Dh) views, made once

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
        if layout.decode_offsets is not None:  # in place: the kernel reads the pool's rows where they are
            if not layout.prefills:
                out = paged_decode(rows, keys, values, layout.decode_context, layout.decode_offsets)  # (N, H, Dh)
                return out.transpose(0, 1).unsqueeze(0), None
            out = torch.empty_like(rows)
            out[layout.decode_rows] = paged_decode(rows[layout.decode_rows], keys, values, layout.decode_context,
                                                   layout.decode_offsets)
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
