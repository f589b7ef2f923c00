"""The paged key/value cache: fixed-size blocks from one pool that every sequence shares, each
sequence reaching its own through a block table (PagedAttention's layout, Kwon et al. 2023).

Why pages: a preallocated (B, Hkv, Tmax, Dh) cache holds the longest answer's room for every
request; blocks are taken as tokens arrive and given back the moment a request ends, so the
memory held follows the tokens actually stored (at most one part-filled block per sequence).

Admission reserves, allocation draws: a request is admitted only when the pool can promise it
the blocks of its prompt plus its longest answer (``reserve``); blocks are then allocated one at
a time from that promise as the sequence grows. A running sequence therefore never finds the
pool empty, and a full pool makes new requests wait instead of corrupting running ones.
"""

from __future__ import annotations

import torch
from torch import Tensor


def blocks_for(tokens: int, block_size: int) -> int:
    """How many blocks of ``block_size`` hold ``tokens`` tokens."""
    return -(-tokens // block_size)


class BlockPool:
    """Keys and values of every layer in ``num_blocks`` blocks of ``block_size`` token slots.

    Storage is slot-major, (layers, num_blocks * block_size, Hkv, Dh): token slot ``s`` of
    block ``b`` is row ``b * block_size + s``, so writing a step's keys is one ``index_copy_`` and
    reading a sequence's is one gather by its slots.
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
        self.reserved = 0  # blocks promised to admitted sequences and not yet allocated

    @property
    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def available(self) -> int:
        """Blocks neither allocated nor promised."""
        return len(self._free) - self.reserved

    def bytes_per_block(self) -> int:
        return 2 * self.keys[:, : self.block_size].nbytes

    def reserve(self, count: int) -> bool:
        """Promise ``count`` blocks to one sequence; False (nothing promised) when the pool cannot."""
        if count > self.available:
            return False
        self.reserved += count
        return True

    def allocate(self) -> int:
        """One block out of a promise made by ``reserve``."""
        if self.reserved < 1:
            raise RuntimeError("allocate() without a reservation")
        self.reserved -= 1
        return self._free.pop()

    def release(self, blocks: list[int], unused_reservation: int) -> None:
        """Give back a sequence's ``blocks`` and what it was promised but never allocated."""
        self.reserved -= unused_reservation
        self._free.extend(reversed(blocks))


class BlockTable:
    """One sequence's blocks in order, the tokens they hold, and its remaining promise.

    The pool rows of its tokens are kept as they are handed out (``slots``), so a step reads a
    sequence's context without recomputing it from the block list."""

    def __init__(self, pool: BlockPool, reservation: int) -> None:
        self.pool = pool
        self.blocks: list[int] = []
        self.length = 0  # tokens stored
        self.reservation = reservation  # blocks promised and not yet allocated
        self._slots = torch.empty(reservation * pool.block_size, dtype=torch.long)  # (capacity,) rows, in order

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

    def release(self) -> None:
        """Give every block and the unused promise back to the pool (idempotent)."""
        self.pool.release(self.blocks, self.reservation)
        self.blocks, self.reservation, self.length = [], 0, 0
