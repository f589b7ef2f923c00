"""The ``dora`` weight backend: DoRA (Liu et al. 2024, weight-decomposed low-rank adaptation), a LoRA adapter whose
adapted rows are renormalised and given a trained length, computed as Hugging Face PEFT's ``use_dora=True`` does.

Each adapted output row i of the layer becomes ``m_i * V_i / ||V_i||`` with ``V = W + scale * B @ A`` (the LoRA-updated
weight, ``lora.py``), ``||.||`` the L2 norm over the row's inputs (PEFT: ``torch.linalg.norm(weight, dim=1)`` of the
(out, in) weight) and ``m`` a trained magnitude per row that starts at the base rows' norms, so an adapter starts
equal to its base. The norm is a constant to the gradient (detached: the paper's section 4.3, PEFT's forward), so
``m``, ``A`` and ``B`` get gradients through the numerator alone. The weight is never built: with ``f = m / ||V||``
per row the output is ``base(x) + (f - 1) * (x @ W.T) + f * scale * (x @ A.T) @ B.T``, the bias left as it is.
With dropout in training, ``x`` is dropped for both extra terms and ``x @ W.T`` recomputed on it (as PEFT does);
otherwise ``x @ W.T`` is the base's output less its bias. Rows outside the adapted blocks keep f = 1.

The norms need the float weight, so DoRA goes over float bases (plain, prepacked) and refuses a quantized one
by name. ``merge`` writes ``f * V`` into the adapted rows (the rows it overwrote kept: ``unmerge`` is bit for bit).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn.weights.backend import LinearBackend
from tformer.nn.weights.lora import AdapterError, LoraLinear


class DoraLinear(LoraLinear):
    """``base`` (a float linear layer, frozen) with its rows ``blocks[j]`` = (start, stop) adapted by DoRA:
    ``lora_A``, ``lora_B`` as ``LoraLinear``'s, and ``lora_magnitude[j]`` (rows_j,) the length of each row;
    (..., in) -> (..., out) like the base."""

    kind = "dora"

    def __init__(self, base: nn.Linear, rank: int, alpha: float, blocks: Sequence[tuple[int, int]] | None = None,
                 dropout: float = 0.0, rslora: bool = False) -> None:
        if isinstance(base, LinearBackend) and not base.lossless:
            raise AdapterError(f"DoRA over a {getattr(base, 'name', 'quantized')} base: its row norms need the "
                               "float weight, which a quantized layer does not hold; use LoRA over a quantized "
                               "base (QLoRA), or DoRA over a float one")
        super().__init__(base, rank, alpha, blocks, dropout, rslora)
        self.lora_magnitude = nn.ParameterList(
            [nn.Parameter(norms.to(self.lora_A[0].dtype)) for norms in self.row_norms()])

    def row_norms(self) -> list[Tensor]:
        """``||W_rows + scale * B_j @ A_j||`` over each row's inputs, (rows_j,) per block, in float32 and
        detached (the unmerged weight's)."""
        weight = self.base.weight
        with torch.no_grad():
            return [torch.linalg.vector_norm(weight[start:stop].float() + update, dim=1)
                    for (start, stop), update in zip(self.blocks, self.block_updates(), strict=True)]

    def row_factors(self) -> Tensor:
        """``m / ||V||`` (out,) of every output row: 1 outside the adapted blocks; gradients reach ``m`` only."""
        magnitude = self.lora_magnitude[0]
        pieces, position = [], 0
        for (start, stop), m, norms in zip(self.blocks, self.lora_magnitude, self.row_norms(), strict=True):
            if start > position:
                pieces.append(magnitude.new_ones(start - position))
            pieces.append(m / norms.to(m.dtype))
            position = stop
        if position < self.out_features:
            pieces.append(magnitude.new_ones(self.out_features - position))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        if self.merged:  # the base's weight holds f * V
            return out
        factors = self.row_factors()  # (out,)
        if self.training and not isinstance(self.dropout, nn.Identity):
            x = self.dropout(x)
            plain = F.linear(x, self.base.weight)  # (..., out): x @ W.T of the dropped input
        else:
            plain = out if self.base.bias is None else out - self.base.bias
        extra = (factors - 1) * plain.to(factors.dtype) + factors * self.product(x)
        return out + extra.to(out.dtype)

    def merge(self) -> None:
        """Write ``f * V`` into the base's adapted rows (the overwritten rows kept for ``unmerge``)."""
        if self.merged:
            return
        weight = self.float_weight()
        norms = self.row_norms()
        replaced = []
        with torch.no_grad():
            for (start, stop), update, m, norm in zip(self.blocks, self.block_updates(), self.lora_magnitude, norms,
                                                      strict=True):
                replaced.append(((start, stop), weight[start:stop].clone()))
                rows = (weight[start:stop].float() + update) * (m.float() / norm).unsqueeze(1)
                weight[start:stop] = rows.to(weight.dtype)
        self._replaced_rows = replaced

    def extra_repr(self) -> str:
        return "dora, " + super().extra_repr()
