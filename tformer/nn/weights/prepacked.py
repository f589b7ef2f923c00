"""The ``prepacked`` weight backend: nn.Linear's own parameters, read at inference the way this host multiplies
them fastest at decoding sizes.

Why: a decoding step multiplies a few rows by every weight, so its time is the weights' bytes over the memory's
bandwidth, and how far a product gets toward that bandwidth depends on how it walks the weight. For one to seven
rows a layer takes the fastest of three ways, raced once per process, thread count and weight type
(``few_row_ways``):
- "compiled": tformer's own kernel (``nn/kernels/matvec.cpp``, float32 or bfloat16 weights, where the compiled
  kernels build): each thread reads its share of the (out, in) weight as two long streams (bfloat16: four), the
  bias added in the same pass, every sum in float32. Over a Llama-3.2-1B-shaped model's weights it and the
  batched product below both read about as fast as the memory lets (32.4 and 31.3 GB/s against a float32 sum's
  32.4), and on the feed-forward's 2048 x 8192 down projection it reads 1.4x the batched product's bytes per
  second (benchmarks/matvec_bandwidth.py on the AMD EPYC host, two threads);
- "split": a weight of 512 KB or more cut along its outputs into one block of rows per thread, multiplied as one
  batched product over nn.Linear's own (out, in) weight, no copy (an output size the thread count does not divide
  is cut along its inputs, the partial products summed); on some CPUs MKL runs a matrix-vector product on one
  thread whatever the thread count, and this gives every thread its share;
- "whole": one product over an (in, out) contiguous copy, which MKL's matrix-vector product reads about 1.6x
  faster than the (out, in) layout (what an Intel Xeon with MKL chose over "split", 2.4-3.4x faster there).
From 8 to 64 rows a large weight is multiplied as W @ x.T from the (out, in) weight, which MKL does faster for a
wide-by-skinny product (1.1-1.5x at 16 rows on GPT-2's shapes); more rows (beam search over a batch) read the
(in, out) copy in one product. A bfloat16 weight that stays in cache meets up to 16 rows in the compiled kernel
(``BFLOAT16_KERNEL_MAX_ROWS``: the library's bfloat16 product has a fixed cost a few times the kernel's).

The (in, out) copy costs one more layer's worth of memory; it is made only for a layer that reads it (the
"whole" way, a split along the inputs, 65 rows or more), on its first such call. Everything is read only inside a
decoding step (``decoding()``, which generation sessions and the serving engine enter for each step); any other
call multiplies by the parameters themselves, exactly as nn.Linear. What a layer derived is made on the first step
and rebuilt when the weights change or the thread count does: new storage or an in-place change (the tensor's
version counter) is seen at every step; a change that keeps the version (PyTorch's fused AdamW steps do) is seen
by ``verify()``, which every ``Model.decoding_view`` runs (every ``generate`` call, the serving engine's start) by
comparing a sample of the weights with what was derived from them. Weights made in inference mode keep no version
counter: they are read as they are, nothing derived.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn import compiled
from tformer.nn.weights.backend import LinearBackend, decoding_step, fastest_of_rounds

# Smaller weights stay in cache and gain nothing from a second thread, nor from W @ x.T at 8-64 rows
# (measured here).
SPLIT_MIN_ELEMENTS = 1 << 17
# From 8 to 64 rows a large weight runs as W @ x.T (see the module's docstring); beyond, the output's
# transposed copy costs more than the product gains (2.4x slower at 320 rows for an 8,000-token output
# layer of width 256, measured here: beam search's batches).
TRANSPOSED_MIN_ROWS, TRANSPOSED_MAX_ROWS = 8, 64
# The weight types tformer's compiled kernel multiplies (the activations in the same type).
COMPILED_TYPES = (torch.float32, torch.bfloat16)
# A bfloat16 product costs PyTorch's matrix library 39-65 us a call at sizes that stay in cache (float32 17-34),
# so a weight under SPLIT_MIN_ELEMENTS meets up to this many rows in the compiled kernel, which reads it once per
# four rows: 19-40 us at 8 rows of 128 x 128 to 512 x 128 weights (benchmarks/matvec_bandwidth.py --small on the
# Intel Xeon with AMX, two threads); 23-63 us at 16 rows against 50-61, and the library ahead beyond (a /tmp
# microbenchmark there), as it is from 8 rows on in float32 and on larger weights.
BFLOAT16_KERNEL_MAX_ROWS = 16
# The ways to multiply one to seven rows, fastest first on this host, by thread count and weight type
# (``few_row_ways``).
_FEW_ROW_WAYS: dict[tuple[int, torch.dtype], tuple[str, ...]] = {}


class PrepackedLinear(LinearBackend):
    """A linear layer whose inference reads its weight the way ``PackedWeight`` lays out."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PrepackedLinear:
        module = cls.__new__(cls)
        module._adopt(linear)
        module._packed = None  # PackedWeight, made on the first inference call
        return module

    def forward(self, x: Tensor) -> Tensor:
        packed = self._packed
        # A step runs without gradients; new storage or a new thread count is seen by verify() (every
        # decoding_view), an in-place change here by the version counters the layout was made at.
        if (packed is None or not decoding_step.depth or packed.weight._version != packed.version
                or (packed.bias is not None and packed.bias._version != packed.bias_version)):
            packed = self.packed() if decoding_step.depth else None
            if packed is None:  # outside decoding steps (or inference-mode weights): exactly nn.Linear
                parameters = self._parameters
                return F.linear(x, parameters["weight"], parameters["bias"])
        # The product, written here rather than in a method of PackedWeight: one Python frame less per
        # projection, a few hundred times a step.
        rows = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])  # (N, in): the stack passes rows already
        count, bias = rows.shape[0], packed.bias
        if count < packed.kernel_rows:  # tformer's kernel, the bias in its pass
            out = packed.kernels.float_matvec(rows.contiguous(), packed.weight, packed.bias_or_none)
        elif count < TRANSPOSED_MIN_ROWS and packed.row_parts is not None:  # a few rows: every thread its outputs
            columns = rows.t().expand(packed.parts, -1, -1)  # (parts, in, N)
            if bias is None:
                out = torch.bmm(packed.row_parts, columns)
            else:
                out = torch.baddbmm(packed.bias_rows, packed.row_parts, columns)  # (parts, out / parts, N)
            out = out.view(1, packed.size_out) if count == 1 else out.view(packed.size_out, count).t().contiguous()
        elif count < TRANSPOSED_MIN_ROWS and packed.parts > 1:  # outputs that do not divide: cut the inputs
            slices = rows.reshape(count, packed.parts, packed.slice_size).transpose(0, 1)  # (parts, N, in / parts)
            weight_parts = packed.in_out().view(packed.parts, packed.slice_size, packed.size_out)  # no copy
            if bias is None:
                out = torch.bmm(slices, weight_parts).sum(0)
            else:
                out = torch.baddbmm(packed.bias_parts, slices, weight_parts).sum(0)
        elif count >= TRANSPOSED_MIN_ROWS and count <= TRANSPOSED_MAX_ROWS and packed.weight_out_in is not None:
            if bias is None:
                out = torch.mm(packed.weight_out_in, rows.t()).t().contiguous()
            else:
                out = torch.addmm(packed.bias_column, packed.weight_out_in, rows.t()).t().contiguous()
        elif bias is None:
            out = torch.mm(rows, packed.in_out())
        else:
            out = torch.addmm(bias, rows, packed.in_out())
        return out if x.ndim == 2 else out.view(*x.shape[:-1], packed.size_out)

    def packed(self) -> PackedWeight | None:
        """The layout of the current weights (rebuilt when they or the thread count changed); None for weights
        made in inference mode, which keep no version to tell a change by (they are read as they are)."""
        weight, bias = self.weight, self.bias
        if weight.is_inference() or (bias is not None and bias.is_inference()):
            return None
        if self._packed is None or self._packed.source != _fingerprint(weight, bias):
            with torch.no_grad():
                self._packed = PackedWeight(weight, bias)
        return self._packed

    def verify(self) -> None:
        """Drop the layout if the weights no longer hold what it was made from (a change that kept their
        version: a fused optimiser step), by a sample of their values."""
        packed = self._packed
        if packed is not None and not packed.holds(self.weight, self.bias):
            self._packed = None

    def extra_repr(self) -> str:
        return super().extra_repr() + ", prepacked"


class PackedWeight:
    """How ``PrepackedLinear.forward`` multiplies inputs (..., in) by a weight (out, in) and bias -> (..., out).
    One to seven rows take the first of this host's ``few_row_ways`` the weight allows: ``kernels`` (tformer's
    compiled kernel, float32 or bfloat16 on the CPU), ``row_parts`` (the weight's output rows cut into one block
    per thread, one batched product) or, when the output size does not divide, the input dimension cut into
    ``parts`` slices of the (in, out) copy whose partial products are summed, else the (in, out) copy whole
    (``in_out``);
    ``weight_out_in`` (the parameter itself) serves 8 to 64 rows, ``in_out`` more."""

    SAMPLES = 32  # values of the weight (spread over it) and of the bias that ``holds`` compares

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.source = _fingerprint(weight, bias)
        self.pointer, self.version, self.threads, self.bias_version = self.source  # what a call compares
        self.sample = _sample(weight, bias, self.SAMPLES)
        weight = weight.detach()
        bias = None if bias is None else bias.detach()
        size_out, size_in = weight.shape
        self.size_out = size_out
        self.weight, self.bias = weight, bias  # detached: the same storage and version counters as the parameters
        # The compiled kernel's bias: float32 (a bfloat16 layer's is added to its float32 sums, then rounded once)
        self.bias_or_none = compiled.NONE if bias is None else bias.float()
        self._in_out: Tensor | None = None  # (in, out) contiguous: made on first use (``in_out``)
        large = weight.numel() >= SPLIT_MIN_ELEMENTS
        # (out, in), contiguous: the same weights for many rows at once (the parameter itself, no copy)
        self.weight_out_in = weight if large and weight.is_contiguous() else None
        self.bias_column = None if bias is None else bias[:, None]
        way = next(way for way in few_row_ways(self.threads, weight.dtype)
                   if _allows(way, weight, bias, large, self.threads))
        self.kernels = compiled.load_or_none() if way == "compiled" else None
        # how many rows the compiled kernel takes: fewer than this
        small_bfloat16 = weight.dtype == torch.bfloat16 and not large
        self.kernel_rows = 0 if self.kernels is None else (
            BFLOAT16_KERNEL_MAX_ROWS + 1 if small_bfloat16 else TRANSPOSED_MIN_ROWS)
        self.parts = self.threads if way == "split" else 1
        self.row_parts = self.bias_rows = None  # (parts, out / parts, in) and (parts, out / parts, 1): no copies
        if self.parts > 1 and size_out % self.parts == 0:
            self.row_parts = weight.view(self.parts, size_out // self.parts, size_in)
            self.bias_rows = None if bias is None else bias.view(self.parts, size_out // self.parts, 1)
        elif self.parts > 1:
            self.slice_size = size_in // self.parts
            # The bias joins the first slice's partial product: (parts, 1, out), zeros after the first.
            self.bias_parts = None
            if bias is not None:
                self.bias_parts = torch.zeros(self.parts, 1, size_out, dtype=bias.dtype, device=bias.device)
                self.bias_parts[0, 0] = bias

    def in_out(self) -> Tensor:
        """The weight as an (in, out) contiguous copy, made on the first call."""
        if self._in_out is None:
            self._in_out = self.weight.t().contiguous()
        return self._in_out

    def holds(self, weight: Tensor, bias: Tensor | None) -> bool:
        """Whether ``weight`` and ``bias`` still hold the sampled values this layout was made from."""
        return self.source == _fingerprint(weight, bias) and all(
            torch.equal(now, then) for now, then in zip(_sample(weight, bias, self.SAMPLES), self.sample, strict=True))


def _allows(way: str, weight: Tensor, bias: Tensor | None, large: bool, threads: int) -> bool:
    """Whether a few rows can be multiplied by ``weight`` (out, in) and ``bias`` the way ``way`` does."""
    size_out, size_in = weight.shape
    if way == "compiled":
        return (weight.device.type == "cpu" and weight.dtype in COMPILED_TYPES and weight.is_contiguous()
                and (bias is None or (bias.dtype == weight.dtype and bias.is_contiguous())))
    if way == "split":
        return (weight.device.type == "cpu" and large and weight.is_contiguous()
                and (size_out % threads == 0 or size_in % threads == 0))
    return True


def few_row_ways(threads: int, dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The ways to multiply one to seven rows by a ``dtype`` weight on this host, fastest first: "compiled" (where
    tformer's kernels build and take the type), "split" (two threads or more) and "whole" (see the module's
    docstring). Measured, not assumed, once per process, thread count and weight type, side by side on a 2048 x 512
    weight (``fastest_of_rounds``): on the AMD EPYC host
    the compiled kernel was about 2x the batched product there (a /tmp microbenchmark, not kept) and the batched
    product 1.4x the whole one; on an Intel
    Xeon (AVX-512) with MKL the batched product was 2.4-3.4x slower than the whole one (benchmarks/generate_speed.py
    --part open: tformer float32 at 0.55-0.61x Hugging Face on Qwen2.5-0.5B and Llama-3.2-1B shapes with the cut)."""
    if (threads, dtype) not in _FEW_ROW_WAYS:
        _FEW_ROW_WAYS[threads, dtype] = _race(threads, dtype)
    return _FEW_ROW_WAYS[threads, dtype]


def _race(threads: int, dtype: torch.dtype) -> tuple[str, ...]:
    generator = torch.Generator().manual_seed(0)  # its own: a measurement leaves the global random state as it was
    size_out = 2048 // threads * threads  # blocks of equal size, one per thread
    weight = torch.randn(size_out, 512, generator=generator).to(dtype)
    row = torch.randn(1, 512, generator=generator).to(dtype)
    in_out, parts = weight.t().contiguous(), weight.view(threads, size_out // threads, 512)
    columns = row.t().expand(threads, -1, -1)
    calls = {"whole": lambda: torch.mm(row, in_out)}
    if threads > 1:
        calls["split"] = lambda: torch.bmm(parts, columns)
    kernels = compiled.load_or_none()
    if kernels is not None and dtype in COMPILED_TYPES:
        calls["compiled"] = lambda: kernels.float_matvec(row, weight, compiled.NONE)
    with torch.no_grad():
        seconds = fastest_of_rounds(calls)
    return tuple(sorted(seconds, key=seconds.__getitem__))


def _sample(weight: Tensor, bias: Tensor | None, count: int) -> tuple[Tensor, ...]:
    """``count`` values spread evenly over the weight, and over the bias (copies)."""
    sampled = []
    for tensor in (weight, bias):
        if tensor is not None:
            flat = tensor.detach().reshape(-1)
            sampled.append(flat[:: max(1, flat.numel() // count)].clone())
    return tuple(sampled)


def _fingerprint(weight: Tensor, bias: Tensor | None) -> tuple:
    """Changes when the weights do (new storage: a load, a move to another dtype or device; an in-place
    change) or the thread count does."""
    return weight.data_ptr(), weight._version, torch.get_num_threads(), None if bias is None else bias._version
