"""Tests run single-threaded: they check behaviour on tiny tensors, where a second OpenMP thread
buys nothing and, on a busy machine, spin-waiting threads slow small ops down by 10x or more.
Set before torch is imported so subprocesses (CLI, torchrun) inherit it. ``make test`` runs the suite in one
pytest-xdist worker per core instead (each single-threaded), so a test shares no state with another through the
process: every file it writes goes under its own ``tmp_path``.

The Hugging Face Hub is off (HF_HUB_OFFLINE) before huggingface_hub is imported: no test reaches the
network, and a missing path that is also a valid Hub name fails at once.

``slow`` marks every test that starts a process, imports a reference library (transformers, seqeval,
openai, ...) or runs over 2 s; ``make test-fast`` (``-m "not slow"``) runs the rest. A module marked slow
as a whole (``pytestmark = pytest.mark.slow`` on a line of its own) is then not even imported: its
module-level imports (transformers, seqeval: seconds each) would load for tests that are all deselected."""

import os
import re
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

WHOLE_MODULE_SLOW = re.compile(r"^pytestmark = pytest\.mark\.slow\b", re.MULTILINE)


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
