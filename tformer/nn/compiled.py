"""The compiled CPU kernels (``nn/kernels/*.cpp``): the in-place paged decode attention
(``paged_decode.cpp``, see ``nn/attention/paged_kernel.py``), one-query decode attention over a dense cache
(``dense_decode.cpp``, see ``nn/attention/sdpa.py``), Performer's one-pass decoding step
(``performer_decode.cpp``, see ``nn/favor.py``), float32 and int8 weights times a few rows of activations
(``matvec.cpp``, see ``nn/weights/prepacked.py`` and ``int8.py``) and the rounding and rescaling around
w8a8's integer product (``int8_dynamic.cpp``, see ``int8.py``), where tensor operations would pass over
memory several times or spend a step on operator calls.

They are built together on first use with ``torch.utils.cpp_extension`` (the machine's C++ compiler and
ninja) into a folder under ``TORCH_EXTENSIONS_DIR`` (by default ~/.cache/torch_extensions) named by a hash of
everything in the build command: the sources, the flags, this checkout's kernel folder and PyTorch's and
Python's headers, so another checkout or PyTorch gets a folder of its own instead of rebuilding this one's.
A build takes about a minute and says so on stderr; so does a process waiting for another's build. Builds
of one folder take turns under an advisory lock (``fcntl.flock``) that the OS drops when its holder dies, so
a build killed midway (which leaves PyTorch's own ``lock`` file behind, and PyTorch waits on that forever)
is started again by the next process instead of blocking it; a live builder is waited for at most
``WAIT_SECONDS``. Commands that report a speed call ``ready`` before their timer starts, so the speed never
includes the build. Where the kernels cannot be built, ``load`` raises ``CompiledKernelError`` with the
reason, once, and callers take their tensor-operation path (the gather, ``decode_one``).
``TFORMER_COMPILED_KERNELS=0`` turns them off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from tformer.errors import TformerError

try:
    import fcntl
except ImportError:  # Windows: PyTorch's own lock file only
    fcntl = None

SOURCES = ("paged_decode.cpp", "dense_decode.cpp", "performer_decode.cpp", "matvec.cpp", "int8_dynamic.cpp")
HEADER = "kernel_math.h"  # what they share, included by each (its text is part of the build's name)
FUNCTIONS = ["paged_decode", "dense_decode", "performer_decode", "int8_matvec", "float_matvec", "int8_round_rows",
             "int8_scale_sums"]
KERNELS = Path(__file__).resolve().with_name("kernels")
NONE = torch.empty(0)  # an optional tensor argument left out (no mask, no bias): the kernels take no None
LOCK = "tformer.lock"  # tformer's advisory lock, beside PyTorch's "lock" file in the build folder
WAIT_SECONDS = 900.0  # the longest wait for another process's build (a build here takes 1 to 4 minutes)
_BUILT: dict[str, ModuleType | str] = {}  # "module" -> the loaded extension, or "error" -> why it failed
_BUILDING = threading.Lock()


class CompiledKernelError(TformerError):
    """The compiled kernels are off, or cannot be built on this machine."""


@dataclasses.dataclass(frozen=True)
class Build:
    """What goes into the kernels' build command; ``name`` hashes all of it, so that one build folder serves one
    command only (PyTorch's ninja would otherwise rebuild a folder whenever another checkout's command differs)."""

    capability: str  # PyTorch's CPU vector unit (AVX2, AVX512, DEFAULT, ...)
    source: str  # the .cpp files, one after another (what ``load_inline`` compiles)
    header: str  # the text of what they include from their folder
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    include_paths: tuple[str, ...]  # this checkout's kernel folder, then PyTorch's and Python's headers
    toolchain: str  # PyTorch's version, Python's ABI and the compiler

    @property
    def name(self) -> str:
        """``tformer_kernels_<capability>_<hash>``: a folder name under ``TORCH_EXTENSIONS_DIR``."""
        parts = (self.capability, self.source, self.header, *self.compile_flags, "|", *self.link_flags, "|",
                 *self.include_paths, self.toolchain)
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
        return f"tformer_kernels_{self.capability.lower()}_{digest}"


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
            _BUILT["module"] = _build(this_build())
        except CompiledKernelError as error:  # a build of another process's that did not end in time
            _BUILT["error"] = str(error)
            raise
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


def ready(device: torch.device | str = "cpu") -> bool:
    """Build (or load) the kernels now where ``device`` is the CPU, and whether they are there: commands that
    report a speed call this before their timer starts, so the speed never counts the build."""
    return torch.device(device).type == "cpu" and load_or_none() is not None


def this_build() -> Build:
    """The build of this checkout's kernels for this machine's vector unit, compiler, PyTorch and Python."""
    from torch.utils.cpp_extension import include_paths

    capability = torch.backends.cpu.get_cpu_capability()
    # -fno-trapping-math: comparisons and conversions in a loop may then become vector selects (no FP traps)
    flags = ["-O3", "-fopenmp", "-fno-trapping-math"]
    if capability in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    if capability == "AVX512":  # what PyTorch's AVX512 capability guarantees, in 512-bit registers
        flags += ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mprefer-vector-width=512"]
    python_headers = sysconfig.get_path("include", scheme="posix_prefix") or ""
    toolchain = f"torch {torch.__version__}, {sys.implementation.cache_tag}, {os.environ.get('CXX', 'c++')}"
    return Build(capability, source="\n".join((KERNELS / name).read_text() for name in SOURCES),
                 header=(KERNELS / HEADER).read_text(), compile_flags=tuple(flags), link_flags=("-fopenmp",),
                 include_paths=(str(KERNELS), *include_paths("cpu"), python_headers), toolchain=toolchain)


def _build(build: Build) -> ModuleType:
    """Compile ``build`` (where its folder holds no finished one) and import it, taking turns with other processes
    on the folder's lock."""
    from torch.utils.cpp_extension import _get_build_directory, load_inline

    folder = Path(_get_build_directory(build.name, False))
    with _turn(folder):
        if not (folder / f"{build.name}.so").is_file():
            print(f"tformer: building the CPU kernels in {folder} (once per machine and checkout, about a minute)",
                  file=sys.stderr, flush=True)
        with _ninja_on_path():
            return load_inline(build.name, cpp_sources=build.source, functions=FUNCTIONS,
                               extra_cflags=list(build.compile_flags), extra_ldflags=list(build.link_flags),
                               extra_include_paths=[build.include_paths[0]], build_directory=str(folder))


@contextlib.contextmanager
def _turn(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s build lock: an advisory lock on ``folder/tformer.lock`` naming its holder, which the OS
    drops when the holder dies. Holding it, a PyTorch ``lock`` file left in ``folder`` is a killed build's: it
    and the build's half-made files are removed (PyTorch would wait on that file forever)."""
    if fcntl is None:  # no advisory locks: PyTorch's lock file alone
        yield
        return
    with open(folder / LOCK, "a+") as handle:
        if not _locked(handle):
            holder = (folder / LOCK).read_text().strip() or "another process"
            print(f"tformer: waiting for {holder}, which is building the CPU kernels in {folder}", file=sys.stderr,
                  flush=True)
            deadline = time.monotonic() + WAIT_SECONDS
            while not _locked(handle):
                if time.monotonic() > deadline:  # said here too: load_or_none's callers go on without a word
                    message = (f"{holder} has been building the CPU kernels in {folder} for over {WAIT_SECONDS:.0f} "
                               "s; end that process (the next build starts again), or set TFORMER_COMPILED_KERNELS=0")
                    print(f"tformer: {message}", file=sys.stderr, flush=True)
                    raise CompiledKernelError(message)
                time.sleep(0.2)
        handle.truncate(0)
        handle.write(f"process {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        try:
            if (folder / "lock").exists():
                print(f"tformer: a build of the CPU kernels in {folder} was cut short (its process is gone); "
                      "starting it again", file=sys.stderr, flush=True)
                for path in folder.iterdir():
                    if path.name != LOCK and path.is_file():
                        path.unlink()
            yield
        finally:
            handle.truncate(0)
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)


def _locked(handle) -> bool:
    """Whether this process now holds ``handle``'s advisory lock (taken without waiting)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


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
