"""The attention kernels by name: the one list configs, models and commands ask (``attention_kernel``).

Adding a kernel is one file (a subclass of ``AttentionKernel``, see kernel.py) and one entry here.
"""

from __future__ import annotations

from tformer.nn.attention.chunked import ChunkedKernel
from tformer.nn.attention.kernel import AttentionKernel
from tformer.nn.attention.performer import PerformerKernel
from tformer.nn.attention.reference import ReferenceKernel
from tformer.nn.attention.sdpa import SdpaKernel
from tformer.nn.attention.sliding_window import SlidingWindowKernel

KERNELS: dict[str, type[AttentionKernel]] = {
    kernel.name: kernel
    for kernel in (SdpaKernel, ReferenceKernel, ChunkedKernel, PerformerKernel, SlidingWindowKernel)
}


def kernel_class(name: str) -> type[AttentionKernel]:
    """The kernel registered as ``name``; an unknown name is a ValueError listing the known ones."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"attention kernel {name!r} is not one of {', '.join(KERNELS)}") from None
