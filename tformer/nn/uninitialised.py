"""Building a model without initialising its weights, for a load that writes every one of them next.

A model's constructor fills each weight (PyTorch's layers by ``torch.nn.init``, then ``Model.init_weights``): work
a load throws away, and the most of its time: 13.7 of 22.5 s for a Llama-3.2-1B-shaped folder (4.9 GB of float32)
on the 2-core AMD EPYC host (a cProfile of ``tformer.load``, a /tmp script not kept; the whole load's times are in
benchmarks/logs/load_speed-epyc-2026-11-29.log: 22.55 s before, 3.48 s after). Inside ``without_initialisation()``
the functions of ``torch.nn.init`` leave their tensor as it is, in this thread only (another thread building a
model meanwhile initialises it as always), so the weights hold whatever memory they were given until the load
overwrites them. Callers use it only where a load that does not write every weight fails (``hub._build``: no new
head, every tensor checked present before any is copied).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator

from torch.nn import init

# The initialisers PyTorch's layers and tformer's init_weights call (first argument: the tensor filled in place).
INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "kaiming_uniform_",
                "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "orthogonal_")


class _Skipping(threading.local):
    depth = 0


_skipping = _Skipping()
_installed = threading.Lock()


@contextlib.contextmanager
def without_initialisation() -> Iterator[None]:
    """Modules built in this block, in this thread, keep their weights uninitialised (``torch.empty``'s memory)."""
    _install()
    _skipping.depth += 1
    try:
        yield
    finally:
        _skipping.depth -= 1


def _install() -> None:
    """Put a wrapper that honours ``without_initialisation`` in place of each of ``INITIALISERS``, once."""
    with _installed:
        for name in INITIALISERS:
            original = getattr(init, name)
            if not getattr(original, "_tformer_skippable", False):
                setattr(init, name, _skippable(original))


def _skippable(initialiser: Callable) -> Callable:
    @functools.wraps(initialiser)
    def initialise(tensor, *args, **kwargs):
        if _skipping.depth:
            return tensor
        return initialiser(tensor, *args, **kwargs)

    initialise._tformer_skippable = True
    return initialise
