"""The ``lora`` weight backend: a frozen linear layer on any backend (plain, prepacked, int8, int4: the last
is QLoRA) plus trainable low-rank updates of its rows (Hu et al. 2021), swapped in as a module like every
backend, so the model's code does not change.

``y = base(x) + scale * (dropout(x) @ A_j.T) @ B_j.T`` on each adapted block of output rows j: a layer can be
adapted whole, or only some row blocks of a fused matrix (tformer's ``qkv_proj`` holds the query, key and
value rows: an adapter on Hugging Face's ``q_proj`` alone adapts the query rows). ``A_j`` (rank, in) starts
as PEFT's does (Kaiming-uniform, a = sqrt(5)), ``B_j`` (rows, rank) at zero, so an adapted model starts equal
to its base; ``scale`` is alpha / rank, or alpha / sqrt(rank) with rsLoRA. The blocks share one dropout mask
and one product by their stacked ``A`` (Hugging Face PEFT draws a mask per module: the same function in
evaluation, another random draw in training).

The base stays what it was (a quantized base keeps its integers; only its input gets gradients, see
``quantized.py``); its parameters are frozen. ``merge`` adds ``scale * B_j @ A_j`` into a float base's
weight rows, keeping the rows it overwrote, so ``unmerge`` restores the base bit for bit; a quantized base
has no float weight to merge into and refuses.

The update alone is a ``LoraUpdate`` (the one LoRA product); ``LoraLinear`` is one over its base,
``LoraEmbedding`` one over a token table (the product over the ids' one-hot rows, looked up), and
``multi_lora.MultiLoraLinear`` holds several over one base, each row taking one (serving many adapters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.errors import TformerError
from tformer.nn.weights.backend import LinearBackend


class AdapterError(TformerError):
    """An adapter that cannot be made, loaded or merged as asked: the message names why."""


def lora_scale(rank: int, alpha: float, rslora: bool) -> float:
    """The factor of the low-rank update: alpha / rank (LoRA), alpha / sqrt(rank) (rsLoRA)."""
    return alpha / math.sqrt(rank) if rslora else alpha / rank


class LoraUpdate(nn.Module):
    """The low-rank update alone: ``scale * B_j @ A_j`` on the output rows ``blocks[j]`` = (start, stop) of a layer
    of ``in_features`` inputs and ``out_features`` outputs; ``update`` (..., in) -> (..., out). The one LoRA
    product: ``LoraLinear`` adds it to its base's output, ``MultiLoraLinear`` (``multi_lora.py``) to the rows of
    each adapter's requests."""

    kind = "lora"  # the adapter kind (``dora.DoraLinear``: "dora")

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float,
                 blocks: Sequence[tuple[int, int]] | None = None, dropout: float = 0.0, rslora: bool = False,
                 dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> None:
        super().__init__()
        self._make_update(in_features, out_features, rank, alpha, blocks, dropout, rslora, dtype, device)

    def _make_update(self, in_features: int, out_features: int, rank: int, alpha: float,
                     blocks: Sequence[tuple[int, int]] | None, dropout: float, rslora: bool, dtype: torch.dtype,
                     device: torch.device | None) -> None:
        """Check the settings and make ``lora_A`` (PEFT's initialisation) and ``lora_B`` (zero) of each block."""
        self.in_features, self.out_features = in_features, out_features
        self.blocks = tuple((int(start), int(stop)) for start, stop in (blocks or [(0, out_features)]))
        _check_blocks(self.blocks, out_features)
        smallest = min([in_features] + [stop - start for start, stop in self.blocks])
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 < rank <= smallest:
            raise AdapterError(f"rank={rank!r} must be a whole number from 1 to {smallest} for a layer of "
                               f"{in_features} inputs and blocks of {_sizes(self.blocks)} outputs")
        if not 0.0 <= dropout < 1.0:
            raise AdapterError(f"lora dropout={dropout!r} must be in [0, 1)")
        self.rank, self.alpha, self.rslora = rank, float(alpha), bool(rslora)
        self.scale = lora_scale(rank, alpha, rslora)
        self.lora_A = nn.ParameterList(
            [nn.Parameter(torch.empty(rank, in_features, dtype=dtype, device=device)) for _ in self.blocks])
        self.lora_B = nn.ParameterList(
            [nn.Parameter(torch.zeros(stop - start, rank, dtype=dtype, device=device)) for start, stop in self.blocks])
        for a in self.lora_A:
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # PEFT's (nn.Linear's) initialisation of lora_A
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @classmethod
    def of(cls, layer: LoraUpdate) -> LoraUpdate:
        """The update of ``layer`` (a ``LoraLinear``) without its base: the very same parameters. A DoRA layer's
        output is not its base's plus an update of its own (it rescales the base's rows too) and is refused."""
        if layer.kind != "lora":
            raise AdapterError(f"a {layer.kind} adapter is not a LoRA update to add to its base's output (DoRA "
                               "rescales each adapted row of the base by its magnitude): only LoRA adapters go "
                               "without their base")
        update = cls.__new__(cls)
        nn.Module.__init__(update)
        update.in_features, update.out_features, update.blocks = layer.in_features, layer.out_features, layer.blocks
        update.rank, update.alpha, update.rslora, update.scale = layer.rank, layer.alpha, layer.rslora, layer.scale
        update.lora_A, update.lora_B, update.dropout = layer.lora_A, layer.lora_B, layer.dropout
        return update

    @property
    def whole(self) -> bool:
        """Whether one block covers every output row (no zero rows to place between blocks)."""
        return self.blocks == ((0, self.out_features),)

    def update(self, x: Tensor) -> Tensor:
        """``scale * dropout(x) @ A_j.T @ B_j.T`` on each block's rows, zero elsewhere: (..., in) -> (..., out),
        in the adapter's dtype."""
        return self.product(self.update_input(x))

    def update_input(self, x: Tensor) -> Tensor:
        """What the update multiplies: the input, dropped out in training."""
        return self.dropout(x)

    def low(self, x: Tensor) -> Tensor:
        """``x @ A_j.T`` of every block: (..., in) -> (..., blocks * rank), in the adapter's dtype."""
        a = self.lora_A[0] if len(self.lora_A) == 1 else torch.cat(list(self.lora_A))  # (blocks * rank, in)
        return F.linear(x.to(a.dtype), a)

    def product(self, x: Tensor) -> Tensor:
        """``scale * x @ A_j.T @ B_j.T`` on each block's rows, zero elsewhere (``update`` without its dropout)."""
        low = self.low(x)  # (..., blocks * rank)
        if self.whole:
            return F.linear(low, self.lora_B[0]) * self.scale
        pieces, position = [], 0
        for index, (start, stop) in enumerate(self.blocks):
            if start > position:
                pieces.append(low.new_zeros(*low.shape[:-1], start - position))
            pieces.append(F.linear(low[..., index * self.rank:(index + 1) * self.rank], self.lora_B[index]))
            position = stop
        if position < self.out_features:
            pieces.append(low.new_zeros(*low.shape[:-1], self.out_features - position))
        return torch.cat(pieces, dim=-1) * self.scale

    forward = update

    def block_updates(self) -> list[Tensor]:
        """``scale * B_j @ A_j`` (rows_j, in) of each block, in float32."""
        return [(b.float() @ a.float()) * self.scale for a, b in zip(self.lora_A, self.lora_B, strict=True)]

    def extra_repr(self) -> str:
        blocks = "" if self.whole else f", rows={list(self.blocks)}"
        rslora = ", rslora" if self.rslora else ""
        return f"rank={self.rank}, alpha={self.alpha:g}, scale={self.scale:g}{rslora}{blocks}"


class LoraLinear(LoraUpdate):
    """``base`` (a linear layer on any weight backend, frozen) plus ``scale * B_j @ A_j`` on the output rows
    ``blocks[j]`` = (start, stop); (..., in) -> (..., out) like the base."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, blocks: Sequence[tuple[int, int]] | None = None,
                 dropout: float = 0.0, rslora: bool = False) -> None:
        nn.Module.__init__(self)
        if isinstance(base, LoraLinear) or not isinstance(base, nn.Linear):
            raise AdapterError(f"a LoRA adapter goes over a linear layer, not {type(base).__name__}")
        self.base = base
        self._make_update(base.in_features, base.out_features, rank, alpha, blocks, dropout, rslora,
                          adapter_dtype(base), base_device(base))
        base.requires_grad_(False)
        self._replaced_rows: list[tuple[tuple[int, int], Tensor]] | None = None  # a merge's overwritten rows

    @property
    def merged(self) -> bool:
        return self._replaced_rows is not None

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        if self._replaced_rows is not None:  # merged: the base's weight holds the update
            return out
        if self.whole and out.dtype == self.lora_B[0].dtype:
            # out + scale * low @ B.T in one multiply-add: no (..., out) product, scaled copy or sum made beside out
            low = self.low(self.update_input(x))  # (..., rank)
            # B.T made contiguous (rank, out): its gradient is then low.T @ grad, a wide product, not the
            # skinny (out, N) @ (N, rank) the transposed view gets (as slow as the base's product for a head)
            return torch.addmm(out.reshape(-1, out.shape[-1]), low.reshape(-1, self.rank),
                               self.lora_B[0].t().contiguous(), alpha=self.scale).view(out.shape)
        return out + self.update(x).to(out.dtype)

    def merge(self) -> None:
        """Add the update into the base's float weight (the overwritten rows kept for ``unmerge``)."""
        if self.merged:
            return
        weight = self.float_weight()
        replaced = []
        with torch.no_grad():
            for (start, stop), update in self.weight_updates():
                replaced.append(((start, stop), weight[start:stop].clone()))
                weight[start:stop] = (weight[start:stop].float() + update).to(weight.dtype)
        self._replaced_rows = replaced

    def unmerge(self) -> None:
        """The base's weight as it was before ``merge``, bit for bit."""
        if not self.merged:
            return
        weight = self.float_weight()
        with torch.no_grad():
            for (start, stop), rows in self._replaced_rows:
                weight[start:stop] = rows
        self._replaced_rows = None

    def weight_updates(self) -> list[tuple[tuple[int, int], Tensor]]:
        """((start, stop), the update of the base weight's rows start:stop in float32) of each block."""
        return list(zip(self.blocks, self.block_updates(), strict=True))

    def float_weight(self) -> Tensor:
        """The base's float weight (out, in), which a merge changes; a quantized base has none and refuses."""
        if isinstance(self.base, LinearBackend) and not self.base.lossless:
            raise AdapterError(f"a {getattr(self.base, 'name', 'quantized')} base holds integers, not a float weight "
                               "to merge into: dequantize the model first (tformer.quantization.dequantized), "
                               "then merge (the merged weights are float)")
        return self.base.weight

    def extra_repr(self) -> str:
        return super().extra_repr() + (", merged" if self.merged else "")


class LoraEmbedding(LoraLinear):
    """``base`` (a float token table (V, D), frozen) plus a low-rank update of its rows: ids (...) -> (..., D)
    like the base. The update is a LoRA product over the ids' one-hot rows, looked up rather than multiplied:
    ``lora_A[0]`` (rank, V) and ``lora_B[0]`` (D, rank), PEFT's ``lora_embedding_A`` and ``lora_embedding_B``,
    started as PEFT starts them (A at zero, B standard normal), so the adapted table starts equal to its base. As
    in PEFT, a lookup takes no dropout."""

    def __init__(self, base: nn.Embedding, rank: int, alpha: float, blocks: Sequence[tuple[int, int]] | None = None,
                 dropout: float = 0.0, rslora: bool = False) -> None:
        nn.Module.__init__(self)
        if not isinstance(base, nn.Embedding) or not base.weight.is_floating_point():
            raise AdapterError(f"a LoRA adapter goes over a float token table here, not {type(base).__name__}")
        if blocks is not None and list(blocks) != [(0, base.embedding_dim)]:
            raise AdapterError(f"an adapter over a token table adapts all of it, not rows {list(blocks)}")
        self.base = base
        self._make_update(base.num_embeddings, base.embedding_dim, rank, alpha, None, dropout, rslora,
                          base.weight.dtype, base.weight.device)
        with torch.no_grad():
            self.lora_A[0].zero_()
            nn.init.normal_(self.lora_B[0])
        base.requires_grad_(False)
        self._replaced_rows = None

    @property
    def num_embeddings(self) -> int:
        return self.base.num_embeddings

    @property
    def embedding_dim(self) -> int:
        return self.base.embedding_dim

    def update_input(self, ids: Tensor) -> Tensor:
        return ids  # no dropout on a lookup

    def low(self, ids: Tensor) -> Tensor:
        """``A.T[ids]``, the ids' one-hot rows times ``A.T``: (...) ids -> (..., rank); the update is
        ``scale * (B @ A).T[ids]``."""
        return F.embedding(ids, self.lora_A[0].t(), padding_idx=self.base.padding_idx)

    def weight_updates(self) -> list[tuple[tuple[int, int], Tensor]]:
        """The update of every row of the table (V, D), in float32."""
        return [((0, self.in_features), self.block_updates()[0].t())]

    def extra_repr(self) -> str:
        return f"token table {self.in_features} x {self.out_features}, " + super().extra_repr()


def adapter_dtype(base: nn.Linear) -> torch.dtype:
    """The dtype an adapter over ``base`` is held in: a float base's, float32 over a quantized one."""
    weight = getattr(base, "weight", None)
    return weight.dtype if isinstance(weight, Tensor) and weight.is_floating_point() else torch.float32


def base_device(base: nn.Linear) -> torch.device:
    """The device of ``base``'s tensors (a quantized layer's are buffers)."""
    tensor = next(iter(base.parameters()), None)
    if tensor is None:
        tensor = next(iter(base.buffers()), None)
    return torch.device("cpu") if tensor is None else tensor.device


def _check_blocks(blocks: tuple[tuple[int, int], ...], rows: int) -> None:
    position = 0
    for start, stop in blocks:
        if not position <= start < stop <= rows:
            raise AdapterError(f"adapter row blocks {list(blocks)} must be in order, apart, within 0..{rows}")
        position = stop


def _sizes(blocks: tuple[tuple[int, int], ...]) -> str:
    return "/".join(str(stop - start) for start, stop in blocks)
