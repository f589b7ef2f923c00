"""Paged decode attention in place: a small C++ kernel (``nn/kernels/paged_decode.cpp``) that computes each decoding
sequence's attention over its keys and values where they sit in the block pool, instead of gathering
every context into one padded batch for the model's kernel (``paged.py``) at every layer of every step.

It computes plain softmax attention at the default scale over all of a sequence's keys, which is what
a kernel declaring ``reads_pages`` computes for one query at the end of its context: so it serves a
model whose every attention kernel declares it and whose positions add no bias to the scores; other
models decode by the gather. It is one of the compiled CPU kernels (``nn/compiled.py``: built once per
machine); on another device, or where they cannot be built, the step gathers.

Modes (``Engine(paged_attention=...)``, ``tformer serve --paged-attention``): ``auto`` reads in place
where the model and the machine allow it and gathers elsewhere, saying which; ``in-place`` refuses a model
or machine it cannot serve (fail closed); ``gather`` always gathers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer.errors import TformerError
from tformer.nn.compiled import CompiledKernelError, load
from tformer.nn.positions import POSITIONAL_SCHEMES

MODES = ("auto", "in-place", "gather")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class PagedKernelError(TformerError):
    """The in-place kernel was asked for and cannot serve (the model, the device, or no compiler)."""


def model_problem(model: nn.Module) -> str | None:
    """Why the in-place kernel cannot decode ``model``, or None (the build aside, see ``load``)."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu":
        return f"it is built for the CPU, and the model is on {parameter.device.type}"
    if parameter.dtype not in DTYPES:
        return f"it computes float32, bfloat16, float16 and float64, not {parameter.dtype}"
    kernels = [module.kernel for module in model.modules() if hasattr(module, "kernel")
               and hasattr(module, "num_kv_heads")]
    other = sorted({kernel.name for kernel in kernels if not type(kernel).reads_pages})
    if other:
        return f"attention_kernel={other[0]!r} is not plain softmax attention over the whole context"
    if any(not kernel.reads_pages for kernel in kernels):  # a cap on the scores, or another scale
        return "its attention caps the scores (attention_softcap) or scales them otherwise (query_pre_attn_scalar)"
    positional = model.config.positional
    if POSITIONAL_SCHEMES[positional].adds_bias:
        return f"positional={positional!r} adds a bias to the scores"
    return None


def resolve(mode: str, model: nn.Module) -> tuple[bool, str]:
    """Whether the engine reads the pool in place for ``mode``, and a line saying what it does and why."""
    if mode not in MODES:
        raise PagedKernelError(f"paged_attention={mode!r} must be one of {', '.join(MODES)}")
    if mode == "gather":
        return False, "paged attention: gather (asked for)"
    problem = model_problem(model)
    if problem is None:
        try:
            load()
        except CompiledKernelError as error:
            problem = str(error)
    if problem is None:
        return True, "paged attention: in place"
    if mode == "in-place":
        raise PagedKernelError(f"paged_attention='in-place' cannot serve this model: {problem}")
    return False, f"paged attention: gather ({problem})"


def paged_decode(queries: Tensor, keys: Tensor, values: Tensor, context: Tensor, offsets: Tensor) -> Tensor:
    """queries (B, H, Dh) one per decoding sequence; keys and values (slots, Hkv, Dh) one layer's pool;
    ``context`` (N,) the pool rows of every sequence's keys in order, sequence after sequence, ``offsets``
    (B + 1,) where each sequence's rows start. Softmax attention per sequence and head -> (B, H, Dh)."""
    return load().paged_decode(queries.contiguous(), keys, values, context, offsets, queries.shape[-1] ** -0.5)
