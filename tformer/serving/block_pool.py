"""The paged key/value cache's memory, which the serving engine manages: keys and values in fixed-size blocks
from one pool that every sequence shares, each sequence reaching its own through a block table
(PagedAttention's layout, Kwon et al. 2023). ``tformer.nn.attention.paged`` attends over the slots a table
hands out; it knows nothing of blocks.

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
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor


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

    def copy_slots(self, sources: Tensor, targets: Tensor) -> None:
        """Copy the keys and values of token slots ``sources`` (S,) into slots ``targets`` (S,), every layer (a beam
        taking over another's tokens); the sources are read whole before any target is written."""
        for storage in (self.keys, self.values):  # (L, slots, Hkv, Dh)
            storage[:, targets] = storage[:, sources]

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
        self._slot_values = self._slots.numpy()  # the same memory, written a token at a time without torch's indexing
        if self.blocks:
            self._slots[: self.length] = (torch.tensor(self.blocks)[:, None] * size + torch.arange(size)).view(-1)

    def append_slots(self, count: int) -> Tensor:
        """Slots (count,) for the next ``count`` tokens, taking blocks from the promise as needed."""
        start = self.length
        self.append(count)
        return self._slots[start:self.length]

    def append(self, count: int) -> None:
        """``append_slots`` without the slots returned (a step reads them from the table)."""
        start, end, size = self.length, self.length + count, self.pool.block_size
        if end > self._slots.numel():
            raise RuntimeError(f"sequence grew past its reservation ({len(self.blocks)} blocks)")
        while len(self.blocks) * size < end:
            self.blocks.append(self.pool.allocate())
            self.reservation -= 1
        if count == 1:
            self._slot_values[start] = self.blocks[start // size] * size + start % size
        else:
            positions = torch.arange(start, end)
            blocks = torch.tensor(self.blocks, dtype=torch.long)[positions // size]
            self._slots[start:end] = blocks * size + positions % size
        self.length = end

    def last_slot(self) -> int:
        """The pool row of the last stored token."""
        if not self.length:
            raise IndexError("the table stores no token")
        return int(self._slot_values[self.length - 1])

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
