"""The ``prepacked`` weight backend: nn.Linear's own parameters, and for inference a copy of each
weight laid out as the CPU's matrix library reads it fastest at decoding sizes.

Why: a decoding step multiplies a few rows by every weight, and on some CPUs MKL runs a matrix-vector
product on one thread whatever the thread count. For one to seven rows, where that holds on this host
(``splitting_pays`` measures it once per process), a weight of 512 KB or more is therefore cut along its
outputs into one block of rows per thread, and the blocks multiply the inputs
as one batched product: every thread reads its share of nn.Linear's own (out, in) weight, no copy
(decoding steps of a 14M GPT-2 about 1.4x faster on two cores than cutting along the inputs and summing
the partial products, which is what an output size the thread count does not divide still gets;
measured with benchmarks/compare_trees.py). Smaller weights read an (in, out) contiguous copy, which
MKL's matrix-vector product reads about 1.6x faster than the (out, in) layout. From 8 to 64 rows, a
large weight is multiplied as W @ x.T from the (out, in) weight, which MKL does faster for a
wide-by-skinny product (1.1-1.5x at 16 rows on GPT-2's shapes); more rows (beam search over a batch)
read the (in, out) copy in one product.

The copy costs one more model's worth of memory while the backend is in place. It is read only inside
a decoding step (``decoding()``, which generation sessions and the serving engine enter for each step);
any other call multiplies by the parameters themselves, exactly as nn.Linear. The copy is made on the
first step and rebuilt when the weights change or the thread count does: new storage or an in-place
change (the tensor's version counter) is seen at every step; a change that keeps the version (PyTorch's
fused AdamW steps do) is seen by ``verify()``, which every ``Model.decoding_view`` runs (every
``generate`` call, the serving engine's start) by comparing a sample of the weights with the copy's.
Weights made in inference mode keep no version counter: they are read as they are, never copied.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn.weights.backend import LinearBackend, decoding_step

# Smaller weights stay in cache and gain nothing from a second thread, nor from W @ x.T at 8-64 rows
# (measured here).
SPLIT_MIN_ELEMENTS = 1 << 17
# From 8 to 64 rows a large weight runs as W @ x.T (see the module's docstring); beyond, the output's
# transposed copy costs more than the product gains (2.4x slower at 320 rows for an 8,000-token output
# layer of width 256, measured here: beam search's batches).
TRANSPOSED_MIN_ROWS, TRANSPOSED_MAX_ROWS = 8, 64
# Whether cutting a weight per thread pays, by thread count: measured once per process (``splitting_pays``).
_SPLITTING_PAYS: dict[int, bool] = {}


class PrepackedLinear(LinearBackend):
    """A linear layer whose inference reads a prepacked copy of its weight (``PackedWeight``)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PrepackedLinear:
        module = cls.__new__(cls)
        module._adopt(linear)
        module._packed = None  # PackedWeight, made on the first inference call
        return module

    def forward(self, x: Tensor) -> Tensor:
        packed = self._packed
        # A step runs without gradients; new storage or a new thread count is seen by verify() (every
        # decoding_view), an in-place change here by the version counters the copy was made at.
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
        if count < TRANSPOSED_MIN_ROWS and packed.row_parts is not None:  # a few rows: every thread its outputs
            columns = rows.t().expand(packed.parts, -1, -1)  # (parts, in, N)
            if bias is None:
                out = torch.bmm(packed.row_parts, columns)
            else:
                out = torch.baddbmm(packed.bias_rows, packed.row_parts, columns)  # (parts, out / parts, N)
            out = out.view(1, packed.size_out) if count == 1 else out.view(packed.size_out, count).t().contiguous()
        elif count < TRANSPOSED_MIN_ROWS and packed.parts > 1:  # outputs that do not divide: cut the inputs
            slices = rows.reshape(count, packed.parts, packed.slice_size).transpose(0, 1)  # (parts, N, in / parts)
            if bias is None:
                out = torch.bmm(slices, packed.weight_parts).sum(0)
            else:
                out = torch.baddbmm(packed.bias_parts, slices, packed.weight_parts).sum(0)
        elif count >= TRANSPOSED_MIN_ROWS and count <= TRANSPOSED_MAX_ROWS and packed.weight_out_in is not None:
            if bias is None:
                out = torch.mm(packed.weight_out_in, rows.t()).t().contiguous()
            else:
                out = torch.addmm(packed.bias_column, packed.weight_out_in, rows.t()).t().contiguous()
        elif bias is None:
            out = torch.mm(rows, packed.weight_in_out)
        else:
            out = torch.addmm(bias, rows, packed.weight_in_out)
        return out if x.ndim == 2 else out.view(*x.shape[:-1], packed.size_out)

    def packed(self) -> PackedWeight | None:
        """The packed copy of the current weights (rebuilt when they or the thread count changed); None for
        weights made in inference mode, which keep no version to tell a change by (they are read as they are)."""
        weight, bias = self.weight, self.bias
        if weight.is_inference() or (bias is not None and bias.is_inference()):
            return None
        if self._packed is None or self._packed.source != _fingerprint(weight, bias):
            with torch.no_grad():
                self._packed = PackedWeight(weight, bias)
        return self._packed

    def verify(self) -> None:
        """Drop the copy if the weights no longer hold what it was made from (a change that kept their
        version: a fused optimiser step), by a sample of their values."""
        packed = self._packed
        if packed is not None and not packed.holds(self.weight, self.bias):
            self._packed = None

    def extra_repr(self) -> str:
        return super().extra_repr() + ", prepacked"


class PackedWeight:
    """A weight (out, in) and bias laid out for ``x @ weight_in_out + bias`` on inputs (..., in) -> (..., out)
    (``PrepackedLinear.forward`` multiplies). With ``parts > 1`` a few rows are multiplied by ``row_parts``,
    the weight's output rows cut into that many blocks (one per thread) as one batched product, or when
    the output size does not divide, by ``weight_parts``, the input dimension cut into slices whose partial
    products are summed; ``weight_out_in`` (the parameter itself) serves 8 to 64 rows."""

    SAMPLES = 32  # values of the weight (spread over it) and of the bias that ``holds`` compares

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.source = _fingerprint(weight, bias)
        self.pointer, self.version, self.threads, self.bias_version = self.source  # what a call compares
        self.sample = _sample(weight, bias, self.SAMPLES)
        weight = weight.detach()
        bias = None if bias is None else bias.detach()
        parts = self.threads if weight.device.type == "cpu" and splitting_pays(self.threads) else 1
        size_out, size_in = weight.shape
        self.size_out = size_out
        self.weight, self.bias = weight, bias  # detached: the same storage and version counters as the parameters
        self.weight_in_out = weight.t().contiguous()  # (in, out)
        large = weight.numel() >= SPLIT_MIN_ELEMENTS
        self.parts = parts if large and parts > 1 and size_in % parts == 0 else 1
        # (out, in), contiguous: the same weights for many rows at once (the parameter itself, no copy)
        self.weight_out_in = weight if large and weight.is_contiguous() else None
        self.bias_column = None if bias is None else bias[:, None]
        self.row_parts = self.bias_rows = None  # (parts, out / parts, in) and (parts, out / parts, 1): no copies
        if self.parts > 1 and size_out % self.parts == 0 and self.weight_out_in is not None:
            self.row_parts = weight.view(self.parts, size_out // self.parts, size_in)
            self.bias_rows = None if bias is None else bias.view(self.parts, size_out // self.parts, 1)
        if self.parts > 1:
            self.slice_size = size_in // self.parts
            self.weight_parts = self.weight_in_out.view(self.parts, self.slice_size, size_out)  # no copy
            # The bias joins the first slice's partial product: (parts, 1, out), zeros after the first.
            self.bias_parts = None
            if bias is not None:
                self.bias_parts = torch.zeros(self.parts, 1, size_out, dtype=bias.dtype, device=bias.device)
                self.bias_parts[0, 0] = bias

    def holds(self, weight: Tensor, bias: Tensor | None) -> bool:
        """Whether ``weight`` and ``bias`` still hold the sampled values this copy was made from."""
        return self.source == _fingerprint(weight, bias) and all(
            torch.equal(now, then) for now, then in zip(_sample(weight, bias, self.SAMPLES), self.sample, strict=True))



def splitting_pays(threads: int) -> bool:
    """Whether on this host one row multiplies faster by a weight cut into one block of outputs per thread (a
    batched product) than by its (in, out) copy in one product. Measured, not assumed (once per process and thread
    count, on a 2048 x 512 weight): the cut was 1.4x faster on the AMD EPYC host it was tuned on and 2.4-3.4x
    slower on an Intel Xeon (AVX-512) with MKL, in cache and out of it (benchmarks/generate_speed.py --part open:
    tformer float32 at 0.55-0.61x Hugging Face on Qwen2.5-0.5B and Llama-3.2-1B shapes with the cut)."""
    if threads < 2:
        return False
    if threads not in _SPLITTING_PAYS:
        _SPLITTING_PAYS[threads] = _time_split(threads) < _time_whole()
    return _SPLITTING_PAYS[threads]


def _time_whole() -> float:
    weight_in_out, row = _probe((512, 2048)), _probe((1, 512))
    return _best_seconds(lambda: torch.mm(row, weight_in_out))


def _time_split(threads: int) -> float:
    weight, row = _probe((2048, 512)), _probe((1, 512))
    parts, columns = weight.view(threads, 2048 // threads, 512), row.t().expand(threads, -1, -1)
    return _best_seconds(lambda: torch.bmm(parts, columns))


def _probe(shape: tuple[int, int]) -> Tensor:
    """Values to time products on, drawn from a generator of their own: a measurement leaves the global random state
    (a seeded generation's sampling) as it was."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def _best_seconds(product, calls: int = 20, rounds: int = 5) -> float:
    """The fastest of ``rounds`` runs of ``calls`` calls (after a warm-up), in seconds per call."""
    with torch.no_grad():
        for _ in range(3):
            product()
        best = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(calls):
                product()
            best = min(best, (time.perf_counter() - started) / calls)
    return best


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
