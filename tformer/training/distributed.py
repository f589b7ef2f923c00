"""Several processes through PyTorch's own engine: ``torchrun`` starts them, this module joins
the process group (gloo on CPU, NCCL on GPU), wraps the model in DDP or shards it with FSDP
(``fully_shard``), and offers the few collectives the trainer needs.

Every collective is bounded by ``training.dist_timeout_s``: if a peer dies or hangs, the others
raise instead of waiting for ever, and the trainer turns that into a one-line error.
"""

from __future__ import annotations

import atexit
import gc
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from tformer.nn.stack import TransformerStack
from tformer.training.config import TrainingError


@dataclass(frozen=True)
class ProcessContext:
    """This process's place in the job: its rank among ``world_size`` and the device it uses."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Only the main process (rank 0) writes logs and checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    """``auto``: the process's GPU when there is one, else the CPU; ``cuda:N``: GPU N."""
    kind, _, index = choice.partition(":")
    if kind == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise TrainingError(f"training.device={choice!r} but no CUDA device is available; use 'auto' or 'cpu'")
        if index and int(index) >= torch.cuda.device_count():
            raise TrainingError(f"training.device={choice!r} but this machine has {torch.cuda.device_count()} CUDA "
                                f"device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        if not index and local_rank >= torch.cuda.device_count():
            raise TrainingError(f"training.device={choice!r}: this process (local rank {local_rank}) has no GPU of its "
                                f"own; this machine has {torch.cuda.device_count()} CUDA device(s): start at most one "
                                "process per GPU, or train on 'cpu'")
        return torch.device("cuda", int(index) if index else local_rank)
    return torch.device("cpu")


def join_process_group(device_choice: str = "auto", timeout_s: float = 300.0) -> ProcessContext:
    """The process context, joining the process group when launched as one of several
    processes (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size > 1 and ":" in device_choice:
        raise TrainingError(f"training.device={device_choice!r} names one GPU; under torchrun each process takes "
                            "its own: use 'cuda' or 'auto'")
    device = pick_device(device_choice, local_rank)
    if world_size <= 1:
        return ProcessContext(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        options = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **options)
        atexit.register(leave_process_group)  # a script that never leaves still does so before teardown
    return ProcessContext(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
                          device=device)


def leave_process_group() -> None:
    """Destroy the process group, after collecting garbage: sharded (FSDP) modules and their
    pending work freed only at interpreter exit, after the group is gone, made a process abort
    now and then ("terminate called without an active exception", 5 runs in 28 here). A group
    left to interpreter teardown aborted the same way under DDP; ``join_process_group``
    registers this to run at exit, and running it twice is harmless."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, context: ProcessContext, mode: str) -> nn.Module:
    """DDP around the model, or FSDP shards of each block and the whole (``mode="fsdp"``);
    the model itself when there is one process. FSDP shards in place: the returned module
    is ``model``, with DTensor parameters."""
    if not context.is_distributed:
        return model
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The mesh on the training device: left to itself, fully_shard takes CUDA whenever PyTorch sees a GPU,
        # also for a run on the CPU.
        mesh = init_device_mesh(context.device.type, (context.world_size,))
        for stack in (module for module in model.modules() if isinstance(module, TransformerStack)):
            for block in stack.blocks:
                fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [context.device.index] if context.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def all_reduce_sum(tensor: torch.Tensor, context: ProcessContext) -> torch.Tensor:
    """Sum ``tensor`` over processes in place (a no-op for one process)."""
    if context.is_distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(value, context: ProcessContext) -> list:
    """Every process's ``value`` (small, picklable Python objects), in rank order."""
    if not context.is_distributed:
        return [value]
    gathered: list = [None] * context.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def barrier(context: ProcessContext) -> None:
    if context.is_distributed:
        dist.barrier()


def is_collective_failure(error: BaseException) -> bool:
    """Whether an exception came from a collective whose peers died or timed out."""
    backend_error = getattr(dist, "DistBackendError", ())
    if backend_error and isinstance(error, backend_error):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ("gloo", "nccl", "connection", "timed out", "timeout", "peer")
    )


def on_main_process(action, context: ProcessContext):
    """Run ``action()`` on the main process only (a write); the others wait for it and, if it
    failed, raise too instead of waiting for a collective that will never come."""
    error: BaseException | None = None
    result = None
    if context.is_main:
        try:
            result = action()
        except Exception as caught:  # shared with the other processes, then re-raised
            error = caught
    if context.is_distributed:
        message = None if error is None else (str(error).splitlines() or [type(error).__name__])[0]
        message = all_gather_objects(message, context)[0]
        if error is None and message is not None:
            raise TrainingError(f"the main process failed: {message}")
    if error is not None:
        raise error
    return result
