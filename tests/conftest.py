"""Tests run single-threaded: they check behaviour on tiny tensors, where a second OpenMP thread
buys nothing and, on a busy machine, spin-waiting threads slow small ops down by 10x or more.
Set before torch is imported so subprocesses (CLI, torchrun) inherit it.

The Hugging Face Hub is off (HF_HUB_OFFLINE) before huggingface_hub is imported: no test reaches the
network, and a missing path that is also a valid Hub name fails at once."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
