"""What the quantized weight backends share: a linear layer whose weight is held as small integers and
scales (``int8.py``: per output channel; ``int4.py``: per group of inputs), multiplied by PyTorch's fused
CPU kernels, which read the packed integers directly (weight-only quantization: the activations stay
floating point).

A decoding step reads every weight once, so its speed is the memory bandwidth over the model's bytes:
fewer bytes per weight is the way past that ceiling. The kernels run their arithmetic in the activations'
dtype; which one is faster depends on the host (bfloat16 on CPUs with native bf16 units, often float32 on
others), so ``compute_dtype`` measures both once per process and kind and keeps the faster. Results
differ between the two by bfloat16's rounding only.

A quantized layer keeps no float weight: it is lossy, so ``use_weights`` never swaps it for another
backend (``to_linear`` gives a float layer back explicitly, with the quantization's error in it). Off the
CPU, the same integers and scales are multiplied as a dequantized float weight.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn.weights.backend import LinearBackend

COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
_measured: dict[tuple[str, str], torch.dtype] = {}  # (backend name, device type) -> the faster compute dtype


class QuantizedLinear(LinearBackend):
    """The base of the int8 and int4 layers: ``(..., in) -> (..., out)`` through the backend's kernel, in
    ``compute_dtype`` (measured), the result in the input's dtype, plus the float bias."""

    name: ClassVar[str]
    lossless = False

    def _start(self, in_features: int, out_features: int, bias: Tensor | None) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.register_parameter("weight", None)  # no float weight: integers and scales instead
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self._compute: torch.dtype | None = None  # chosen on the first call (``compute_dtype``)
        self.register_load_state_dict_post_hook(_forget_prepared)  # loaded integers: prepare them again

    @classmethod
    def empty(cls, in_features: int, out_features: int, bias: bool, **scheme) -> QuantizedLinear:
        """A layer of this shape with zero weights, to be filled by ``load_state_dict`` (loading a quantized
        checkpoint)."""
        zeros = nn.Linear(in_features, out_features, bias=bias)
        with torch.no_grad():
            zeros.weight.zero_()
            if bias:
                zeros.bias.zero_()
        return cls.from_linear(zeros, **scheme)

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
        raise NotImplementedError

    def _kernel(self, rows: Tensor) -> Tensor:
        """rows (N, in) in the compute dtype -> (N, out), by the fused CPU kernel."""
        raise NotImplementedError

    def _prepare(self, dtype: torch.dtype) -> None:
        """Make what the kernel reads in ``dtype`` (scales cast once, not at every call)."""

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        if x.device.type != "cpu":  # the CPU kernels only: the same integers as a float weight elsewhere
            out = F.linear(rows, self.dequantized_weight().to(rows.dtype))
        else:
            compute = self._compute
            if compute is None:
                compute = self._compute = compute_dtype(type(self))
                self._prepare(compute)
            out = self._kernel(rows.to(compute).contiguous())
        if out.dtype != x.dtype:
            out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):
        self._compute = None  # a move or cast: prepare the kernel's inputs again on the next call
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{self.name}")


def _forget_prepared(module: QuantizedLinear, incompatible_keys) -> None:
    module._compute = None


def compute_dtype(backend: type[QuantizedLinear], device: str = "cpu") -> torch.dtype:
    """The dtype ``backend``'s kernel runs fastest in on this host, measured once per process: float32 and
    bfloat16 on a layer of GPT-2's width at one and at sixteen rows (a decoding step, a batch)."""
    key = (backend.name, device)
    if key not in _measured:
        _measured[key] = _measure(backend)
    return _measured[key]


def _measure(backend: type[QuantizedLinear]) -> torch.dtype:
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(768, 768)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(768, 768, generator=generator) * 0.02)
    layer = backend.from_linear(linear)
    inputs = [torch.randn(rows, 768, generator=generator) for rows in (1, 16)]
    seconds = {}
    with torch.no_grad():
        for dtype in COMPUTE_DTYPES:
            layer._prepare(dtype)
            cast = [x.to(dtype) for x in inputs]
            for x in cast:
                layer._kernel(x)  # warm up
            rounds = []
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(10):
                    for x in cast:
                        layer._kernel(x)
                rounds.append(time.perf_counter() - started)
            seconds[dtype] = sorted(rounds)[len(rounds) // 2]
    return min(COMPUTE_DTYPES, key=lambda dtype: seconds[dtype])
