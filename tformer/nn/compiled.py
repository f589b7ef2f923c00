"""The compiled CPU kernels (``nn/kernels/*.cpp``): the in-place paged decode attention
(``paged_decode.cpp``, see ``nn/attention/paged_kernel.py``), one-query decode attention over a dense cache
(``dense_decode.cpp``, see ``nn/attention/sdpa.py``), Performer's one-pass decoding step
(``performer_decode.cpp``, see ``nn/performer.py``), int8 weights times a few rows of activations
(``int8_matvec.cpp``) and the rounding and rescaling around w8a8's integer product (``int8_dynamic.cpp``; both
see ``nn/weights/int8.py``), where tensor operations would pass over memory several times or spend a step on
operator calls.

They are built together on first use with ``torch.utils.cpp_extension`` (the machine's C++ compiler and
ninja), once per machine and source: PyTorch caches the build under ``TORCH_EXTENSIONS_DIR`` (by default
~/.cache/torch_extensions); the first build takes about a minute and says so on stderr. Where they
cannot be built, ``load`` raises ``CompiledKernelError`` with the reason, once, and callers take their
tensor-operation path (the gather, ``decode_one``). ``TFORMER_COMPILED_KERNELS=0`` turns them off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

from tformer.errors import TformerError

SOURCES = ("paged_decode.cpp", "dense_decode.cpp", "performer_decode.cpp", "int8_matvec.cpp", "int8_dynamic.cpp")
HEADER = "kernel_math.h"  # what they share, included by each (its text is part of the build's name)
FUNCTIONS = ["paged_decode", "dense_decode", "performer_decode", "int8_matvec", "int8_round_rows", "int8_scale_sums"]
NONE = torch.empty(0)  # an optional tensor argument left out (no mask, no bias): the kernels take no None
_BUILT: dict[str, ModuleType | str] = {}  # "module" -> the loaded extension, or "error" -> why it failed
_BUILDING = threading.Lock()


class CompiledKernelError(TformerError):
    """The compiled kernels are off, or cannot be built on this machine."""


def load() -> ModuleType:
    """The compiled kernels, built on first call; a CompiledKernelError saying why when they cannot be."""
    with _BUILDING:
        if "module" in _BUILT:
            return _BUILT["module"]
        if "error" not in _BUILT and os.environ.get("TFORMER_COMPILED_KERNELS", "1") == "0":
            _BUILT["error"] = "the compiled kernels are off (TFORMER_COMPILED_KERNELS=0)"
        if "error" in _BUILT:
            raise CompiledKernelError(_BUILT["error"])
        try:
            _BUILT["module"] = _build()
        except Exception as error:  # no compiler or ninja, a failed compile: the reason, once
            _BUILT["error"] = f"the compiled kernels could not be built: {_first_line(error)}"
            raise CompiledKernelError(_BUILT["error"]) from None
        return _BUILT["module"]


def load_or_none() -> ModuleType | None:
    """The compiled kernels, or None where they cannot be built (the reason: ``load``'s error): for callers
    with a tensor-operation path to fall back on."""
    try:
        return load()
    except CompiledKernelError:
        return None


def _build() -> ModuleType:
    from torch.utils.cpp_extension import _get_build_directory, load_inline

    capability = torch.backends.cpu.get_cpu_capability()  # the vector unit's flags are part of the name
    # -fno-trapping-math: comparisons and conversions in a loop may then become vector selects (no FP traps)
    flags = ["-O3", "-fopenmp", "-fno-trapping-math"]
    if capability in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    if capability == "AVX512":  # what PyTorch's AVX512 capability guarantees, in 512-bit registers
        flags += ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mprefer-vector-width=512"]
    folder = Path(__file__).with_name("kernels")
    source = "\n".join((folder / name).read_text() for name in (*SOURCES, HEADER))
    digest = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:12]
    name = f"tformer_kernels_{capability.lower()}_{digest}"
    if not (Path(_get_build_directory(name, False)) / f"{name}.so").is_file():
        print("tformer: compiling the CPU kernels (once per machine, about a minute)", file=sys.stderr, flush=True)
    with _ninja_on_path():
        return load_inline(name, cpp_sources="\n".join((folder / file).read_text() for file in SOURCES),
                           functions=FUNCTIONS, extra_cflags=flags, extra_ldflags=["-fopenmp"],
                           extra_include_paths=[str(folder)])


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
