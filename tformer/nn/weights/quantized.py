"""What the quantized weight backends share: a linear layer whose weight is held as small integers and
scales (``int8.py``: per output channel; ``int4.py``: per group of inputs), multiplied by PyTorch's fused
CPU kernels, which read the packed integers directly (weight-only quantization: the activations stay
floating point).

A decoding step reads every weight once, so its speed is the memory bandwidth over the model's bytes:
fewer bytes per weight is the way past that ceiling. Many rows at once (beam search over a batch, an
encoder, a prompt) are arithmetic rather than bandwidth, and there the fused kernels are slower than a
matrix product: so a layer multiplies up to ``MANY_ROWS`` rows by its kernel, and more rows by a matrix
product over its integers converted to floats on the fly (``_product``; int8's integers are exact in
bfloat16, the scales applied to the output). Which dtype each way runs fastest in depends on the host
(bfloat16 on CPUs with native bf16 units, float32 on others), so ``plan_for`` measures the ways once per
process and backend and keeps the fastest for few rows and for many (a ``Plan``). Results differ
between the ways by bfloat16's rounding only. The int8 backends race one more way for few rows, "compiled"
(``nn/kernels/int8_matvec.cpp``, float32: each weight row read once, converted in registers, the next rows
prefetched), where tformer's compiled kernels build; ``w8a8`` adds "dynamic" (``int8.py``: activations
rounded to int8 per row, an integer product), whose rounding is its scheme's.

A quantized layer keeps no float weight: it is lossy, so ``use_weights`` never swaps it for another
backend (``to_linear`` gives a float layer back explicitly, with the quantization's error in it). Off the
CPU, the same integers and scales are multiplied as a dequantized float weight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn import compiled
from tformer.nn.weights.backend import LinearBackend, fastest_of_rounds, reused_weights

COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
# From this many rows a layer multiplies by a matrix product over its integers rather than by the fused
# kernel: at 16 rows the two tie on GPT-2's 2,304 x 768 projection, at 32 the product is 1.5x faster, at
# 320 (beam search) 2.5x (bfloat16, AVX512-BF16 host, measured here).
MANY_ROWS = 32
# The matrix product over many rows makes the float weight a block of output rows of about this many values at a
# time, multiplied while it is in cache: a whole float copy of a large layer costs more than the product itself
# (its fresh pages written, then read again): int8's 16,384 x 2,048 layer at 32 rows took 40 ms whole and 12 ms by
# blocks, a 128,256 x 2,048 head at 128 rows 404-414 and 209-219 ms (products in bfloat16, the Intel Xeon with
# AMX, two threads; benchmarks/logs/quantized_product_blocks-ab-2026-12-01.log).
PRODUCT_BLOCK_VALUES = 1 << 19


@dataclass(frozen=True)
class Plan:
    """How a backend multiplies on this host: few rows by ``few_way`` in ``few``, many rows by ``many_way`` in
    ``many``. A way is "kernel" (the fused kernel), "product" (a matrix product over the integers as floats) or,
    for backends that take it, "compiled" (tformer's own CPU kernel, float32, few rows only) or "dynamic"
    (activations rounded to int8 per row, an integer matrix product; its dtype is None)."""

    few_way: str
    few: torch.dtype | None
    many_way: str
    many: torch.dtype | None

    def describe(self) -> str:
        return f"few rows: {_way_text(self.few_way, self.few)}; many rows: {_way_text(self.many_way, self.many)}"

    @property
    def kernel_dtype(self) -> torch.dtype | None:
        """The dtype the kernel's inputs are prepared in (one for both regimes; ``_measure`` never makes two)."""
        return self.few if self.few_way == "kernel" else self.many if self.many_way == "kernel" else None


_plans: dict[str, Plan] = {}  # backend name -> its measured plan


class QuantizedLinear(LinearBackend):
    """The base of the int8 and int4 layers: ``(..., in) -> (..., out)`` as this host's ``Plan`` says (the
    fused kernel for a few rows, the faster of it and a matrix product for many), the result in the input's
    dtype, plus the float bias."""

    name: ClassVar[str]
    lossless = False
    ways: ClassVar[tuple[str, ...]] = ("kernel", "product")  # what ``plan_for`` measures for this backend

    def _start(self, in_features: int, out_features: int, bias: Tensor | None) -> None:
        """The state every quantized layer has: its shape, no float weight, the float bias (a copy)."""
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.register_parameter("weight", None)  # no float weight: integers and scales instead
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self._plan: Plan | None = None  # chosen on the first call (``plan_for``)
        self.register_load_state_dict_post_hook(_forget_prepared)  # loaded integers: prepare them again

    @classmethod
    def empty(cls, in_features: int, out_features: int, bias: bool, **scheme) -> QuantizedLinear:
        """A layer of this shape holding zeros, to be filled by ``load_state_dict`` (loading a quantized
        checkpoint): its integer buffers are made directly, no float weight on the way."""
        raise NotImplementedError

    def to_linear(self) -> nn.Linear:
        """A float nn.Linear holding the dequantized weight (the quantization's error stays in it)."""
        weight = self.dequantized_weight()
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=weight.device)
        with torch.no_grad():
            linear.weight.copy_(weight)
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    def dequantized_weight(self) -> Tensor:
        """The weight (out, in) in float32 as the integers and scales give it."""
        return self.dequantized_rows(0, self.out_features)

    def dequantized_rows(self, first: int, last: int) -> Tensor:
        """Output rows [first, last) of ``dequantized_weight``: (last - first, in) float32."""
        raise NotImplementedError

    def _kernel(self, rows: Tensor) -> Tensor:
        """rows (N, in) in the dtype ``_prepare`` was given -> (N, out), by the fused CPU kernel."""
        raise NotImplementedError

    def kernel_accepts(self, dtype: torch.dtype) -> bool:
        """Whether the fused kernel takes this layer's shape in ``dtype``; where it does not, the matrix
        product runs instead."""
        return True

    def _product(self, rows: Tensor) -> Tensor:
        """rows (N, in) -> (N, out) in rows' dtype, by a matrix product over the integers as floats."""
        dtype = rows.dtype
        return self._by_blocks(rows, ("weight", dtype),
                               lambda first, last: self.dequantized_rows(first, last).to(dtype))

    def _by_blocks(self, rows: Tensor, key: object, weight_rows: Callable[[int, int], Tensor]) -> Tensor:
        """rows (N, in) times the float weight whose output rows [first, last) ``weight_rows(first, last)`` makes,
        (N, out): ``PRODUCT_BLOCK_VALUES`` of it at a time; within ``reused_weights``, the whole weight, kept under
        ``key`` for the stretch."""
        if reused_weights.depth:
            return F.linear(rows, reused_weights.weight(self, key, lambda: weight_rows(0, self.out_features)))
        block = max(1, PRODUCT_BLOCK_VALUES // self.in_features)
        if block >= self.out_features:
            return F.linear(rows, weight_rows(0, self.out_features))
        out = rows.new_empty(rows.shape[0], self.out_features)
        for first in range(0, self.out_features, block):
            last = min(first + block, self.out_features)
            out[:, first:last] = F.linear(rows, weight_rows(first, last))
        return out

    def float_weight(self, dtype: torch.dtype) -> Tensor:
        """The dequantized weight (out, in) in ``dtype``: made for the call, or kept within ``reused_weights``."""
        return reused_weights.weight(self, ("weight", dtype), lambda: self.dequantized_weight().to(dtype))

    def _prepare(self, dtype: torch.dtype) -> None:
        """Make what the kernel reads in ``dtype`` (scales cast once, not at every call)."""

    def _dynamic(self, rows: Tensor, with_bias: bool = True) -> Tensor:
        """rows (N, in) -> (N, out) float32, the activations rounded to int8 per row (backends whose ``ways``
        name "dynamic"), the bias added unless ``with_bias`` is False."""
        raise NotImplementedError

    def _compiled(self, rows: Tensor) -> Tensor:
        """rows (N, in) -> (N, out) float32 by tformer's compiled CPU kernel (backends whose ``ways`` name
        "compiled"): one pass over the integers, converted to floats in registers."""
        raise NotImplementedError

    def _multiply(self, way: str, dtype: torch.dtype | None, rows: Tensor) -> Tensor:
        """rows (N, in) -> (N, out) in rows' dtype, bias added, by ``way`` in ``dtype`` (a ``Plan``'s choice)."""
        if way == "dynamic" and rows.dtype == torch.float32:
            return self._dynamic(rows)  # adds the bias in its own pass over the sums
        if way == "kernel" and self.kernel_accepts(dtype):
            out = self._kernel(rows.to(dtype).contiguous())
        elif way in ("kernel", "product"):
            out = self._product(rows.to(dtype))
        elif way == "compiled":
            out = self._compiled(rows)
        else:
            out = self._dynamic(rows, with_bias=False)
        return self._plus_bias(out.to(rows.dtype))

    def _plus_bias(self, out: Tensor) -> Tensor:
        return out if self.bias is None else out + self.bias.to(out.dtype)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        if torch.is_grad_enabled() and rows.requires_grad:  # gradients flow to the input (QLoRA), none to the base
            out = _ThroughQuantized.apply(rows, self)
        else:
            out = self._rows(rows)
        return out.view(*x.shape[:-1], self.out_features)

    def _rows(self, rows: Tensor) -> Tensor:
        """rows (N, in) -> (N, out), bias added, as this host's plan says (no gradient)."""
        if rows.device.type != "cpu":  # the CPU kernels only: the same integers as a float weight elsewhere
            return self._plus_bias(self._product(rows))
        plan = self._plan
        if plan is None:
            plan = self._plan = plan_for(type(self))
            if plan.kernel_dtype is not None:
                self._prepare(plan.kernel_dtype)
        if rows.shape[0] >= MANY_ROWS:
            return self._multiply(plan.many_way, plan.many, rows)
        return self._multiply(plan.few_way, plan.few, rows)

    def _apply(self, fn, recurse=True):
        self._plan = None  # a move or cast: prepare the kernel's inputs again on the next call
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{self.name}")


class _ThroughQuantized(torch.autograd.Function):
    """A quantized layer's product with a gradient for its input: the fused kernels have none (int4's raises,
    int8's compiled way returns a tensor cut from the graph). The weight is frozen integers, so the input's
    gradient is grad (N, out) @ W (out, in), W dequantized for this product only (a layer at a time, never
    kept: the model's weights stay integers), as QLoRA trains adapters over a 4-bit base."""

    @staticmethod
    def forward(ctx, rows: Tensor, layer: QuantizedLinear) -> Tensor:
        ctx.layer = layer
        return layer._rows(rows)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad.mm(ctx.layer.float_weight(grad.dtype)), None  # (out, in): made for it, or kept (reused_weights)


def _forget_prepared(module: QuantizedLinear, incompatible_keys) -> None:
    module._plan = None


def plan_for(backend: type[QuantizedLinear]) -> Plan:
    """How ``backend`` multiplies fastest on this host, measured once per process on a layer of GPT-2's width:
    its kernel in float32 and in bfloat16 at one and eight rows (decoding), and for 64 rows the kernel and the
    matrix product in each dtype; the dynamic way too where the backend takes it. The kernel runs in one
    dtype, the faster at few rows, in both regimes. The ways are timed on one thread: they divide their work
    among threads alike, and on a host whose cores are busy with other work, threads that wait on each other
    make the times of several threads a measure of the other processes rather than of the ways (a measurement
    on two busy cores chose int8's float32 kernel, ten times slower than its bfloat16 one)."""
    if backend.name not in _plans:
        _plans[backend.name] = _measure(backend)
    return _plans[backend.name]


def _measure(backend: type[QuantizedLinear]) -> Plan:
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(768, 768)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(768, 768, generator=generator) * 0.02)
    layers = {dtype: backend.from_linear(linear) for dtype in COMPUTE_DTYPES}  # one prepared per kernel dtype
    for dtype, layer in layers.items():
        layer._prepare(dtype)
    inputs = {"few": [torch.randn(rows, 768, generator=generator) for rows in (1, 8)],
              "many": [torch.randn(64, 768, generator=generator)]}

    def timed(regime: str, ways: list[tuple[str, torch.dtype | None]]) -> dict:
        return fastest_of_rounds({(way, dtype): lambda way=way, dtype=dtype: [
            layers[dtype or torch.float32]._multiply(way, dtype, x) for x in inputs[regime]] for way, dtype in ways})

    dynamic = [("dynamic", None)] * ("dynamic" in backend.ways)
    # tformer's compiled kernel races for few rows only, and only where the kernels build (nn/compiled.py)
    own = [("compiled", torch.float32)] * ("compiled" in backend.ways and compiled.load_or_none() is not None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see plan_for
    try:
        with torch.no_grad():
            few = timed("few", [("kernel", dtype) for dtype in COMPUTE_DTYPES] + own + dynamic)
            # The kernel runs in its faster dtype at few rows; many rows race it in that dtype only.
            kernel_dtype = min(COMPUTE_DTYPES, key=lambda dtype: few["kernel", dtype])
            few_way, few_dtype = min([("kernel", kernel_dtype)] + own + dynamic, key=few.__getitem__)
            many = timed("many", [("kernel", kernel_dtype)] + [("product", dtype) for dtype in COMPUTE_DTYPES]
                         + dynamic)
            many_way, many_dtype = min(many, key=many.__getitem__)
    finally:
        torch.set_num_threads(threads)
    return Plan(few_way, few_dtype, many_way, many_dtype)


def _way_text(way: str, dtype: torch.dtype | None) -> str:
    if way == "dynamic":
        return "dynamic (activations rounded to int8 per row, integer product)"
    if way == "compiled":
        return "compiled kernel in float32 (tformer's own, one pass over the integers)"
    return f"{way} in {str(dtype).removeprefix('torch.')}"
