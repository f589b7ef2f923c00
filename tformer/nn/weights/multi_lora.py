"""Several LoRA adapters over one base layer, chosen row by row: the ``multi_lora`` weight backend that serves
many adapters on one model (vLLM's multi-LoRA, punica's idea), with no copy of the model per adapter.

A ``MultiLoraLinear`` holds a frozen base layer (any backend: plain, prepacked, int8, int4) and the update of
each served adapter that adapts it (``LoraUpdate``: the one LoRA product, ``lora.py``; an adapter that leaves
the layer alone has none). For a batch it computes ``base(x)`` for every row, then, adapter by adapter, the
update of that adapter's rows alone, added into them (``index_add_``): each adapter's rows run together, and rows
of no adapter (the base model's requests) add nothing. A row's output is what ``LoraLinear`` with that adapter
alone gives it (``base(x) + update(x)``, the same product on the same row).

In inference (no gradient, no dropout: a server's steps) the adapters' products run stacked instead: every
adapter's ``A`` rows in one matrix and its ``B`` columns in another, so a step costs two products and a mask
whatever the number of adapters (a row's low-rank values of other adapters are multiplied by zero; its own by
the adapter's scale). The stacked matrices are built once and rebuilt when a weight changes. The sums then run
over the stacked ranks, so a row's update equals its adapter's alone to rounding (1e-6 in the tests), not bit
for bit.

Which adapter each row takes is a fact of the step, not of any layer: the engine sets it around each step with
``adapter_rows.use(per_token, keep)`` (a thread-local context, like ``decoding_step``), so no block's or
model's signature carries it. ``per_token`` (N,) names the adapter of each of the step's N token rows (-1: the
base); the layers before the head read N rows, the head only the rows the step keeps (``keep``, the layout's),
so each layer takes the grouping whose row count its input has. Outside such a step (a plain forward, an
embeddings batch) every row is the base's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn.weights.lora import AdapterError, LoraUpdate

Groups = tuple[tuple[int, Tensor], ...]  # (adapter index, the rows that take it (R,)), each adapter once


class _AdapterRows(threading.local):
    """The adapter of each row of this thread's step, grouped by adapter for each row count a layer may see
    (the step's token rows, the rows it keeps for the head); empty outside ``use``."""

    by_rows: dict[int, Groups] = {}  # noqa: RUF012 (a thread-local's class default: replaced, never mutated)
    per_row: dict[int, Tensor] = {}  # noqa: RUF012 (the same rows' adapters (R,) as one tensor, -1: none)

    @contextlib.contextmanager
    def use(self, per_token: Tensor, keep: Tensor | None = None) -> Iterator[None]:
        """Inside: the step's N token rows take the adapters ``per_token`` (N,) names (-1: none); the rows kept
        for the head (``keep``, indices into the N; None: all N) take theirs."""
        kept = per_token if keep is None else per_token[keep]
        previous = (self.by_rows, self.per_row)
        self.by_rows = {len(kept): group_rows(kept), len(per_token): group_rows(per_token)}
        self.per_row = {len(kept): kept, len(per_token): per_token}
        try:
            yield
        finally:
            self.by_rows, self.per_row = previous

    def groups(self, rows: int) -> Groups | None:
        """The groups of a layer input of ``rows`` rows; () outside a step; None when inside one no grouping has
        that many rows (a layer fed a subset of the step's rows: an expert's)."""
        if not self.by_rows:
            return ()
        return self.by_rows.get(rows)


adapter_rows = _AdapterRows()


def group_rows(per_row: Tensor) -> Groups:
    """(adapter, its rows) of each adapter ``per_row`` (R,) names, in adapter order; rows of -1 in none."""
    return tuple((int(index), (per_row == index).nonzero().flatten()) for index in per_row.unique().tolist()
                 if index >= 0)


class MultiLoraLinear(nn.Module):
    """``base`` (frozen) plus, on each row, the update of that row's adapter: ``updates[i]`` is adapter ``i``'s,
    ``names[i]`` its name (None: adapter ``i`` leaves this layer alone). (..., in) -> (..., out) like the base."""

    def __init__(self, base: nn.Linear, updates: Sequence[LoraUpdate | None], names: Sequence[str]) -> None:
        super().__init__()
        if len(names) != len(updates):
            raise AdapterError(f"{len(updates)} adapters' updates and {len(names)} names")
        if not isinstance(base, nn.Linear):
            raise AdapterError(f"LoRA adapters go over a linear layer, not {type(base).__name__}")
        for update in updates:
            if update is not None and (update.in_features, update.out_features) != (base.in_features,
                                                                                      base.out_features):
                raise AdapterError(f"an adapter of a {update.in_features} -> {update.out_features} layer cannot go "
                                   f"over a {base.in_features} -> {base.out_features} one")
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.names = tuple(names)
        self.updates = nn.ModuleDict({str(index): update for index, update in enumerate(updates) if update is not None})
        base.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        groups = adapter_rows.groups(x.numel() // self.in_features if self.in_features else 0)
        if not groups:
            if groups is None:
                raise AdapterError(f"a layer with served adapters got {x.numel() // self.in_features} rows, which are "
                                   "neither the step's tokens nor its kept rows: no adapter can be chosen per row")
            return out
        updates = self.updates._modules
        rows, flat = x.reshape(-1, self.in_features), out.reshape(-1, self.out_features)
        if not self.updates:  # no adapter adapts this layer
            return out
        if self._inference():
            per_row = adapter_rows.per_row[rows.shape[0]]
            a, b, owner, scale = self._stacked()
            low = F.linear(rows.to(a.dtype), a)  # (R, C): every adapter's low-rank values of every row
            low = low * torch.where(per_row[:, None] == owner, scale, 0.0)  # a row keeps its own adapter's, scaled
            flat += F.linear(low, b).to(out.dtype)
            return flat.view(out.shape)
        for index, where in groups:
            update = updates.get(str(index))
            if update is not None:
                flat.index_add_(0, where, update.update(rows[where]).to(out.dtype))
        return flat.view(out.shape)

    def _inference(self) -> bool:
        """Whether this forward may run the stacked products: no dropout, no gradient to any adapter."""
        return not self.training and not (torch.is_grad_enabled()
                                          and any(p.requires_grad for p in self.updates.parameters()))

    def _stacked(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Every adapter's ``A`` rows stacked (C, in), its ``B`` blocks placed at their output rows and stacked
        columns (out, C), each column's adapter (C,) and scale (C,); rebuilt when a weight has changed."""
        parameters = tuple(self.updates.parameters())
        key = tuple((id(p), p._version) for p in parameters)
        if getattr(self, "_stack_key", None) != key:
            with torch.no_grad():
                a_rows, owners, scales, placed = [], [], [], []
                for index, update in self.updates.items():
                    for (start, stop), a, b in zip(update.blocks, update.lora_A, update.lora_B, strict=True):
                        a_rows.append(a)
                        owners += [int(index)] * update.rank
                        scales += [update.scale] * update.rank
                        column = a.new_zeros(self.out_features, update.rank)
                        column[start:stop] = b
                        placed.append(column)
                a_all = torch.cat(a_rows)
                self._stack = (a_all, torch.cat(placed, dim=1), torch.tensor(owners, device=a_all.device),
                               torch.tensor(scales, dtype=a_all.dtype, device=a_all.device))
            self._stack_key = key
        return self._stack

    def extra_repr(self) -> str:
        return f"adapters={[self.names[int(index)] for index in self.updates]} of {list(self.names)}"


def adapter_index(per_sequence: Sequence[int], counts: Sequence[int], device: torch.device) -> Tensor:
    """Each token row's adapter (N,) from each sequence's adapter and its count of new tokens, in order."""
    return torch.repeat_interleave(torch.tensor(per_sequence, dtype=torch.long),
                                   torch.tensor(counts, dtype=torch.long)).to(device)
