"""The ``int8`` weight backend: each output row of the weight as 8-bit integers and one float scale
(symmetric: w ~ q * scale, q in [-127, 127], scale = max |w| of the row / 127), multiplied by
``aten._weight_int8pack_mm`` or, for a few rows, by tformer's own compiled kernel
(``nn/kernels/int8_matvec.cpp``: the "compiled" way, in float32). A quarter of float32's bytes; the error of
a weight is at most half a step (scale / 2)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer.nn import compiled
from tformer.nn.weights.quantized import QuantizedLinear


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight (out, in) -> (int8 (out, in), float32 scales (out,)), symmetric per output row."""
    weight = weight.detach().float()
    scales = weight.abs().amax(dim=1) / 127
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero row: any scale, q = 0
    integers = torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return integers, scales


def dequantize_int8(integers: Tensor, scales: Tensor) -> Tensor:
    """``quantize_int8`` undone: int8 (out, in) and scales (out,) -> float32 (out, in)."""
    return integers.float().mul_(scales[:, None])  # in place: one float tensor, not two


class Int8Linear(QuantizedLinear):
    """A linear layer whose weight is ``qweight`` (out, in) int8 times ``scales`` (out,) float32."""

    name = "int8"
    ways = ("kernel", "product", "compiled")

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        return cls._holding(linear.bias, *quantize_int8(linear.weight))

    @classmethod
    def empty(cls, in_features: int, out_features: int, bias: bool) -> Int8Linear:
        return cls._holding(torch.zeros(out_features) if bias else None,
                            torch.zeros(out_features, in_features, dtype=torch.int8), torch.ones(out_features))

    @classmethod
    def _holding(cls, bias: Tensor | None, integers: Tensor, scales: Tensor) -> Int8Linear:
        module = cls.__new__(cls)
        module._start(integers.shape[1], integers.shape[0], bias)
        module.register_buffer("qweight", integers)
        module.register_buffer("scales", scales)
        module._kernel_scales = None
        return module

    def dequantized_rows(self, first: int, last: int) -> Tensor:
        return dequantize_int8(self.qweight[first:last], self.scales[first:last])

    def _prepare(self, dtype: torch.dtype) -> None:
        self._kernel_scales = self.scales.to(dtype)

    def kernel_accepts(self, dtype: torch.dtype) -> bool:
        # The kernel's bfloat16 path reads a row 16 values at a time and ends the process (a segmentation
        # fault, torch 2.13 on an AVX-512 BF16 host) for other widths: those layers take the product.
        return dtype != torch.bfloat16 or self.in_features % 16 == 0

    def _kernel(self, rows: Tensor) -> Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self._kernel_scales)

    def _compiled(self, rows: Tensor) -> Tensor:
        # The kernel sums in float32 and takes float32 scales: a model cast to bfloat16 holds its scales rounded so
        scales = self.scales if self.scales.dtype == torch.float32 else self.scales.float()
        return compiled.load().int8_matvec(rows.float().contiguous(), self.qweight, scales)

    def _product(self, rows: Tensor) -> Tensor:
        # The integers are exact in bfloat16 and float32 alike; the row scales apply to the outputs.
        dtype = rows.dtype
        sums = self._by_blocks(rows, ("integers", dtype), lambda first, last: self.qweight[first:last].to(dtype))
        return sums * self.scales.to(dtype)


class W8A8Linear(Int8Linear):
    """The int8 weights of ``Int8Linear`` with one more way to multiply, measured beside the others:
    "dynamic", each row of activations rounded to int8 with its own scale (max |x| of the row / 127) and
    multiplied by an integer matrix product (``torch._int_mm``, int32 sums; VNNI units where the CPU has
    them), the two scales applied to the output. The activations' rounding adds an error of at most half a
    step per input, about what bfloat16's does to large inputs but more to small ones; in exchange many
    rows multiply several times faster than in float. The checkpoint is int8's."""

    name = "w8a8"
    ways = ("kernel", "product", "compiled", "dynamic")

    def _dynamic(self, rows: Tensor, with_bias: bool = True) -> Tensor:
        rows = rows.float().contiguous()
        # The rounding and rescaling in one pass each, where the kernels build (float32 scales: the kernels')
        kernels = compiled.load_or_none() if self.scales.dtype == torch.float32 else None
        if kernels is not None:
            integers, steps = kernels.int8_round_rows(rows)
        else:
            integers, steps = round_rows(rows)
        sums = torch._int_mm(integers, self.qweight.t())  # (N, out) int32: exact up to in = 133,000
        bias = self.bias if with_bias and self.bias is not None else None
        if kernels is not None:
            return kernels.int8_scale_sums(sums, steps, self.scales, compiled.NONE if bias is None else bias.float())
        out = sums.float().mul_(steps).mul_(self.scales)
        return out if bias is None else out + bias


def round_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """rows (N, in) float32 -> (int8 (N, in), steps (N, 1)): each row over its own step, max |x| / 127."""
    steps = rows.abs().amax(dim=1, keepdim=True).div_(127).clamp_(min=torch.finfo(torch.float32).tiny)  # (N, 1)
    return rows.div(steps).round_().to(torch.int8), steps  # |x| / step <= 127: no clamp needed
