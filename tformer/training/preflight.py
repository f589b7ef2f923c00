"""Checks made before training starts, so a run does not fail hours in: the output folder can
be written, its disk can hold the checkpoints the run will write, and the model's attention can be trained
on the device."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from tformer.nn.attention.kernel import AttentionKernel
from tformer.training.config import TrainingError

MARGIN_BYTES = 16 * 2**20


def check_writable(out_dir: Path) -> None:
    """Create ``out_dir`` if needed and write a probe file into it."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise TrainingError(f"output folder {out_dir}: exists and is not a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as error:
        raise TrainingError(f"output folder {out_dir}: cannot write there ({error.strerror or error})") from None


def checkpoint_bytes(num_parameters: int, with_optimizer: bool = True) -> int:
    """Size of one checkpoint of fp32 weights (plus AdamW's two moments)."""
    return num_parameters * 4 * (3 if with_optimizer else 1)


def check_disk_space(out_dir: Path, num_parameters: int, free_bytes: int | None = None) -> None:
    """The disk must hold one more training checkpoint, a best model and the final model,
    with a margin: each checkpoint is complete on disk before the one it replaces is removed."""
    needed = checkpoint_bytes(num_parameters) + 2 * checkpoint_bytes(num_parameters, with_optimizer=False)
    needed += MARGIN_BYTES
    free = shutil.disk_usage(out_dir).free if free_bytes is None else free_bytes
    if free < needed:
        raise TrainingError(
            f"output folder {out_dir}: {free / 2**20:,.0f} MiB free, but a checkpoint of this model needs "
            f"about {needed / 2**20:,.0f} MiB; free some space or choose another --out"
        )


def check_kernels_train_on(device: torch.device, model: torch.nn.Module) -> None:
    """On the CPU, a model whose attention kernel has no backward pass there (``trains_on_cpu``: FlexAttention's)
    is refused, naming the kernel."""
    if device.type != "cpu":
        return
    for module in model.modules():
        kernel = getattr(module, "kernel", None)
        if isinstance(kernel, AttentionKernel) and not kernel.trains_on_cpu:
            raise TrainingError(f"attention_kernel={kernel.name!r} has no backward pass on the CPU: train with "
                                "'sdpa' here (--set model.attention_kernel=sdpa), or on a GPU")
