"""The attention kernels by name: the one list configs, models and commands ask (``attention_kernel``),
registered into ``tformer.choices.ATTENTION_KERNELS`` (which config.py reads without importing nn/).

Adding a kernel is one file (a subclass of ``AttentionKernel``, see kernel.py) and one entry here.

``attention_kernel`` picks how attention is computed. ``sdpa`` (PyTorch's fused kernel), ``reference`` (matmul,
mask, softmax, matmul) and ``chunked`` (query and key blocks with an online softmax: memory linear in length)
compute the same exact softmax attention. ``performer`` estimates it with ``performer_features`` positive random
features per head (FAVOR+), redrawn every ``performer_redraw_interval`` training steps (0: drawn once); it has no
score matrix, so it refuses the additive position biases (``positional`` alibi, relative). ``sliding_window`` is
exact attention restricted to a band of ``attention_window`` keys: causal, query i sees keys i - W .. i (itself and
the W previous tokens); bidirectional, keys with |i - j| <= W (W on each side), counted in sequence order (a vision
model's: the class token, then the patches row by row); a decoder's cache then keeps only the last W positions. The
window must be at most the sequence length (``max_seq_len``; a vision model's: patches + 1). ``chunked``,
``sliding_window`` and ``performer`` have no attention dropout (``attention_dropout`` must be 0); the performer and
window fields are refused away from their defaults with any other kernel. ``flex`` computes the same exact
attention through PyTorch's FlexAttention (``flex.py``: the mask and biases as index functions; fused on a GPU,
unfused and forward only on the CPU).
"""

from __future__ import annotations

from tformer.choices import ATTENTION_KERNELS
from tformer.nn.attention.chunked import ChunkedKernel
from tformer.nn.attention.flex import FlexKernel
from tformer.nn.attention.kernel import AttentionKernel
from tformer.nn.attention.performer import PerformerKernel
from tformer.nn.attention.reference import ReferenceKernel
from tformer.nn.attention.sdpa import SdpaKernel
from tformer.nn.attention.sliding_window import SlidingWindowKernel

ATTENTION_KERNELS.register(SdpaKernel, ReferenceKernel, ChunkedKernel, PerformerKernel, SlidingWindowKernel,
                           FlexKernel)
KERNELS: dict[str, type[AttentionKernel]] = ATTENTION_KERNELS
# The kernels that compute softmax attention itself (the same function as sdpa): Hugging Face export and the
# parity tests take only these.
EXACT_ATTENTION_KERNELS = tuple(name for name, kernel in KERNELS.items() if kernel.exact)


def kernel_class(name: str) -> type[AttentionKernel]:
    """The kernel registered as ``name``; an unknown name is a ValueError listing the known ones."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"attention kernel {name!r} is not one of {', '.join(KERNELS)}") from None
