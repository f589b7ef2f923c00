"""The ``int4`` weight backend: the weight's rows cut into groups of ``group_size`` inputs (32, 64 or 128),
each group as 4-bit integers with a float scale and offset (asymmetric: w ~ (q - 8) * scale + zero, q in
[0, 15], the group's minimum at q = 0 and maximum at q = 15), multiplied by
``aten._weight_int4pack_mm_for_cpu``. An eighth of float32's bytes for the integers, plus two floats per
group; the error of a weight is at most half a step (scale / 2).

The checkpoint holds the integers two to a byte (``qweight`` (out, in / 2) uint8: the even input in the
low four bits, the odd one in the high four), ``scales`` and ``zeros`` (out, in / group_size) float32; the
kernel's own layout is made from them on the first call."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer.nn.weights.quantized import QuantizedLinear

GROUP_SIZES = (32, 64, 128)
KERNEL_OUTPUT_MULTIPLE = 16  # aten._convert_weight_to_int4pack_for_cpu takes outputs in multiples of 16


def quantize_int4(weight: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """weight (out, in) -> integers (out, in) int32 in [0, 15], scales and zeros (out, in / group_size) float32."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = (high - low) / 15
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # a constant group: q = 0 is exact
    integers = torch.round((groups - low[..., None]) / scales[..., None]).clamp_(0, 15).to(torch.int32)
    zeros = low + 8 * scales  # the value of q = 8
    return integers.reshape(out_features, in_features), scales, zeros


def pack_nibbles(integers: Tensor) -> Tensor:
    """(out, in) integers in [0, 15] -> (out, in / 2) uint8, the even column in the low four bits."""
    values = integers.to(torch.uint8)
    return values[:, 0::2] | (values[:, 1::2] << 4)


def unpack_nibbles(packed: Tensor, dtype: torch.dtype = torch.int32) -> Tensor:
    """``pack_nibbles`` undone: (out, in / 2) uint8 -> (out, in) in ``dtype``."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1).to(dtype)


def int4_problem(in_features: int, out_features: int, group_size: int) -> str | None:
    """Why a layer of this shape cannot be held in int4 groups of ``group_size``, or None."""
    if group_size not in GROUP_SIZES:
        return f"group_size={group_size!r} is not one of {', '.join(map(str, GROUP_SIZES))}"
    if in_features % group_size:
        return f"its {in_features} inputs are not a multiple of group_size={group_size}"
    return None


def _check_shape(in_features: int, out_features: int, group_size: int) -> None:
    problem = int4_problem(in_features, out_features, group_size)
    if problem is not None:
        raise ValueError(f"int4 weights: a linear layer ({in_features} -> {out_features}): {problem}")


class Int4Linear(QuantizedLinear):
    """A linear layer whose weight is held as 4-bit integers in groups of ``group_size`` inputs."""

    name = "int4"

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 64) -> Int4Linear:
        _check_shape(linear.in_features, linear.out_features, group_size)
        integers, scales, zeros = quantize_int4(linear.weight, group_size)
        return cls._holding(linear.bias, group_size, pack_nibbles(integers), scales, zeros)

    @classmethod
    def empty(cls, in_features: int, out_features: int, bias: bool, group_size: int = 64) -> Int4Linear:
        _check_shape(in_features, out_features, group_size)
        groups = in_features // group_size
        return cls._holding(torch.zeros(out_features) if bias else None, group_size,
                            torch.zeros(out_features, in_features // 2, dtype=torch.uint8),
                            torch.ones(out_features, groups), torch.zeros(out_features, groups))

    @classmethod
    def _holding(cls, bias: Tensor | None, group_size: int, packed: Tensor, scales: Tensor,
                 zeros: Tensor) -> Int4Linear:
        module = cls.__new__(cls)
        module._start(packed.shape[1] * 2, packed.shape[0], bias)
        module.group_size = group_size
        module.register_buffer("qweight", packed)
        module.register_buffer("scales", scales)
        module.register_buffer("zeros", zeros)
        module._packed = module._scales_and_zeros = None
        return module

    def dequantized_rows(self, first: int, last: int) -> Tensor:
        # In place on one float tensor: a large head's weight would otherwise be made four times over at once
        groups = unpack_nibbles(self.qweight[first:last], torch.float32).view(last - first, -1, self.group_size)
        groups.sub_(8).mul_(self.scales[first:last, :, None]).add_(self.zeros[first:last, :, None])
        return groups.view(last - first, -1)

    def _prepare(self, dtype: torch.dtype) -> None:
        # The kernel takes outputs in multiples of 16: pad with rows that are exactly 0 (q = 8, zero 0).
        padding = -self.out_features % KERNEL_OUTPUT_MULTIPLE
        integers, scales, zeros = unpack_nibbles(self.qweight), self.scales, self.zeros
        if padding:
            integers = torch.cat([integers, integers.new_full((padding, integers.shape[1]), 8)])
            scales = torch.cat([scales, scales.new_ones(padding, scales.shape[1])])
            zeros = torch.cat([zeros, zeros.new_zeros(padding, zeros.shape[1])])
        self._packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(integers, 1)
        self._scales_and_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(dtype).contiguous()

    def _kernel(self, rows: Tensor) -> Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self._packed, self.group_size, self._scales_and_zeros)
        return out if out.shape[1] == self.out_features else out[:, :self.out_features]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", group_size={self.group_size}"
