"""Tests run single-threaded: they check behaviour on tiny tensors, where a second OpenMP thread
buys nothing and, on a busy machine, spin-waiting threads slow small ops down by 10x or more.
Set before torch is imported so subprocesses (CLI, torchrun) inherit it. ``make test`` runs the suite in one
pytest-xdist worker per core instead (each single-threaded), so a test shares no state with another through the
process: every file it writes goes under its own ``tmp_path``.

The Hugging Face Hub is off (HF_HUB_OFFLINE) before huggingface_hub is imported: no test reaches the
network, and a missing path that is also a valid Hub name fails at once.

``slow`` marks every test that starts a process, imports a reference library (transformers, seqeval,
openai, ...) or runs over 2 s; so does every test in ``slow_by_cpu.txt``, those measured over a tenth of a
second of CPU time (tools/cpu_times.py makes the list). ``make test-fast`` (``-m "not slow"``) runs the rest.
A module marked slow as a whole (``pytestmark = pytest.mark.slow`` on a line of its own) is then not even
imported: its module-level imports (transformers, seqeval: seconds each) would load for tests that are all
deselected."""

import os
import re
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

WHOLE_MODULE_SLOW = re.compile(r"^pytestmark = pytest\.mark\.slow\b", re.MULTILINE)
SLOW_BY_CPU = Path(__file__).with_name("slow_by_cpu.txt")


def _slow_by_cpu() -> set[str]:
    """The tests slow_by_cpu.txt lists (lines of CPU seconds and a test's id; # starts a comment)."""
    lines = SLOW_BY_CPU.read_text(encoding="utf-8").splitlines()
    return {line.split(maxsplit=1)[1] for line in lines if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark slow the tests measured slow."""
    measured_slow = _slow_by_cpu()
    for item in items:
        if item.nodeid in measured_slow:
            item.add_marker(pytest.mark.slow)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under exactly ``-m "not slow"``, skip importing a test module whose every test is slow (see above)."""
    if config.getoption("markexpr") != "not slow" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return True if WHOLE_MODULE_SLOW.search(collection_path.read_text(encoding="utf-8")) else None


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True, scope="session")
def _compiled_kernels():
    """Build (or load) the compiled CPU kernels before the first test: every decoding step may use them (the
    prepacked backend races its kernel once per process), and the build's line on stderr, or another worker's
    "waiting for" line, must not land in a test that reads its command's stderr."""
    from tformer.nn import compiled

    compiled.ready()
    yield


@pytest.fixture
def traced_on_the_cpu(monkeypatch):
    """What a CUDA machine's captured decoding steps see, on the CPU: each step wrapped by a tracing-only compiler
    that refuses any graph break (``fullgraph``; generation's ``STEP_COMPILERS``, which the serving engine reads too),
    plain weights (a GPU's: the prepacked CPU kernels are opaque to the tracer), short length buckets; dynamo's caches
    and counters reset."""
    from torch._dynamo.utils import counters

    from tformer.generation import session
    from tformer.models import base
    from tformer.nn.attention import cache
    from tformer.serving import captured_decode

    monkeypatch.setitem(session.STEP_COMPILERS, "cpu",
                        lambda step: torch.compile(step, backend="eager", fullgraph=True, dynamic=False))
    monkeypatch.setattr(session, "_WRAPPED_STEPS", {})
    monkeypatch.setattr(cache, "_FREE_BUFFERS", {})
    monkeypatch.setattr(session, "CAPTURED_LENGTH_MULTIPLE", 32)
    monkeypatch.setattr(captured_decode, "LENGTH_MULTIPLE", 32)
    monkeypatch.setattr(base, "decoding_weights", lambda device: "plain")
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()
