"""Quantized token tables: a model's token embedding (V, D) held as int8 rows with one float scale each (the
``int8`` backend's scheme, a token's row being an output channel), looked up by gathering the integer rows
and scaling them. A lookup reads a few rows, so a table's bytes cost no speed; they are most of a small
model's size on disk (BERT's 30,522-piece table is 70% of bert-mini). The error of a looked-up value is at
most half its row's step, as for a weight of an int8 layer.

A table tied to an int8 output head is that head's rows: the head's per-output-channel integers and scales
are exactly the table's per-row ones, so the table reads them (one copy on disk and in memory) instead of
holding its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn.weights.int8 import Int8Linear, dequantize_int8, quantize_int8


class QuantizedTable(nn.Module):
    """A token table ``(...) ids -> (..., D)`` read from int8 rows (V, D) and their scales (V,): its own
    ``qweight`` and ``scales`` buffers, or those of the int8 output head it is tied to (which saves them)."""

    def __init__(self, integers: Tensor | None, scales: Tensor | None, head: Int8Linear | None = None) -> None:
        super().__init__()
        self.owned = head is None
        if self.owned:
            self.register_buffer("qweight", integers)
            self.register_buffer("scales", scales)
        else:
            self._tied_head = [head]  # a list keeps the head out of this module's submodules and state

    @classmethod
    def from_embedding(cls, table: nn.Embedding) -> QuantizedTable:
        """The table's own int8 copy of ``table``'s weight (V, D)."""
        return cls(*quantize_int8(table.weight))

    @classmethod
    def empty(cls, num_embeddings: int, embedding_dim: int) -> QuantizedTable:
        """A table of this shape holding zeros, to be filled by ``load_state_dict``."""
        return cls(torch.zeros(num_embeddings, embedding_dim, dtype=torch.int8), torch.ones(num_embeddings))

    @classmethod
    def tied_to(cls, head: Int8Linear) -> QuantizedTable:
        """A table reading the rows of the int8 head it is tied to."""
        return cls(None, None, head)

    def rows(self) -> tuple[Tensor, Tensor]:
        """The integers (V, D) int8 and scales (V,) the lookups read."""
        if self.owned:
            return self.qweight, self.scales
        head = self._tied_head[0]
        return head.qweight, head.scales

    @property
    def num_embeddings(self) -> int:
        return self.rows()[0].shape[0]

    @property
    def embedding_dim(self) -> int:
        return self.rows()[0].shape[1]

    def forward(self, ids: Tensor) -> Tensor:
        integers, scales = self.rows()
        return F.embedding(ids, integers).to(scales.dtype) * F.embedding(ids, scales[:, None])

    def to_embedding(self) -> nn.Embedding:
        """A float nn.Embedding holding the dequantized rows (the quantization's error stays in them)."""
        integers, scales = self.rows()
        table = nn.Embedding(*integers.shape, device=integers.device)
        with torch.no_grad():
            table.weight.copy_(dequantize_int8(integers, scales))
        return table

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8" + ("" if self.owned else ", the tied head's rows")
