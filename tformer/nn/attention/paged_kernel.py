"""Paged decode attention in place: a small C++ kernel (``paged_decode.cpp``) that computes each decoding
sequence's attention over its keys and values where they sit in the block pool, instead of gathering
every context into one padded batch for the model's kernel (``paged.py``) at every layer of every step.

It computes plain softmax attention at the default scale over all of a sequence's keys, which is what
a kernel declaring ``reads_pages`` computes for one query at the end of its context: so it serves a
model whose every attention kernel declares it and whose positions add no bias to the scores; other
models decode by the gather. It is compiled once per machine with ``torch.utils.cpp_extension`` (a C++
compiler and ninja; cached by PyTorch under ``TORCH_EXTENSIONS_DIR``, by default
~/.cache/torch_extensions), for the CPU; on another device the step gathers.

Modes (``Engine(paged_attention=...)``, ``tformer serve --paged-attention``): ``auto`` reads in place
where the model and the machine allow it and gathers elsewhere, saying which; ``in-place`` refuses a model
or machine it cannot serve (fail closed); ``gather`` always gathers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

from tformer.errors import TformerError

MODES = ("auto", "in-place", "gather")
SOURCE = Path(__file__).with_name("paged_decode.cpp")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_BUILT: dict[str, ModuleType | str] = {}  # "module" -> the loaded extension, or "error" -> why it failed
_BUILDING = threading.Lock()


class PagedKernelError(TformerError):
    """The in-place kernel was asked for and cannot serve (the model, the device, or no compiler)."""


def model_problem(model: nn.Module) -> str | None:
    """Why the in-place kernel cannot decode ``model``, or None (the build aside, see ``load``)."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu":
        return f"it is built for the CPU, and the model is on {parameter.device.type}"
    if parameter.dtype not in DTYPES:
        return f"it computes float32, bfloat16, float16 and float64, not {parameter.dtype}"
    kernels = {type(module.kernel) for module in model.modules() if hasattr(module, "kernel")
               and hasattr(module, "num_kv_heads")}
    other = sorted(kernel.name for kernel in kernels if not kernel.reads_pages)
    if other:
        return f"attention_kernel={other[0]!r} is not plain softmax attention over the whole context"
    positional = getattr(getattr(model, "stack", None), "positional", None)
    if positional is not None and positional.adds_bias:
        return f"positional={positional.kind!r} adds a bias to the scores"
    return None


def load() -> ModuleType:
    """The compiled kernel, built on first call (once per machine and source); a PagedKernelError saying why
    when it cannot be built."""
    with _BUILDING:
        if "module" in _BUILT:
            return _BUILT["module"]
        if "error" in _BUILT:
            raise PagedKernelError(_BUILT["error"])
        try:
            _BUILT["module"] = _build()
        except Exception as error:  # no compiler or ninja, a failed compile: the reason, once
            _BUILT["error"] = f"the in-place paged attention kernel could not be built: {_first_line(error)}"
            raise PagedKernelError(_BUILT["error"]) from None
        return _BUILT["module"]


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load_inline

    capability = torch.backends.cpu.get_cpu_capability()  # the vector unit's flags are part of the name
    flags = ["-O3", "-fopenmp"] + (["-mavx2", "-mfma"] if capability in ("AVX2", "AVX512") else [])
    source = SOURCE.read_text()
    digest = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:12]
    with _ninja_on_path():
        return load_inline(f"tformer_paged_decode_{capability.lower()}_{digest}", cpp_sources=source,
                           functions=["paged_decode"], extra_cflags=flags, extra_ldflags=["-fopenmp"])


@contextlib.contextmanager
def _ninja_on_path():
    """PyTorch runs ``ninja`` from PATH; the pip package's binary is there only in an activated environment."""
    try:
        import ninja
    except ImportError:  # a ninja of the system's, or none (the build then says so)
        yield
        return
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + before
    try:
        yield
    finally:
        os.environ["PATH"] = before


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


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
        except PagedKernelError as error:
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
