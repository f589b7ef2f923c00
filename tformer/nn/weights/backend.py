"""What a weight backend is: a module that takes the place of an ``nn.Linear`` (a module swap; the
model's code does not change) and multiplies by the same weights its own way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from torch import Tensor, nn


class _DecodingStep(threading.local):
    """Whether this thread is inside a decoding step: ``with decoding_step:`` (generation sessions and the
    serving engine enter it for each step, without gradients). Backends that keep a derived copy of the
    weights read it only there, where the weights cannot change under them; everywhere else they act as
    nn.Linear."""

    depth = 0

    @property
    def active(self) -> bool:
        return self.depth > 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self.depth -= 1


decoding_step = _DecodingStep()


class _ReusedWeights(threading.local):
    """Whether this thread is inside a stretch of products over unchanging weights: ``with reused_weights:``
    (``losses.head_loss`` runs the output head on piece after piece of positions). Backends that rebuild a float
    weight on every call (the quantized ones) build it once there and keep it until the outermost block ends."""

    depth = 0

    def __init__(self) -> None:
        self.kept: dict[tuple[nn.Module, object], Tensor] = {}

    def weight(self, layer: nn.Module, key: object, make: Callable[[], Tensor]) -> Tensor:
        """``make()``, kept under (layer, key) for the rest of the block; outside a block, made afresh."""
        if self.depth == 0:
            return make()
        if (layer, key) not in self.kept:
            self.kept[layer, key] = make()
        return self.kept[layer, key]

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.kept.clear()


reused_weights = _ReusedWeights()


class LinearBackend(nn.Linear):
    """The base of the weight backends other than plain ``nn.Linear``: it is built from a linear layer
    (``from_linear``) and gives that layer back (``to_linear``), so a model can move between backends.

    A backend that keeps the layer's parameters (a layout for reading them faster) holds the same
    ``weight`` and ``bias`` parameter objects, so checkpoints, tied weights and training see no change.
    A ``lossless`` = False backend (quantized weights) holds something else, and is never swapped for
    another backend by ``use_weights``.
    """

    lossless = True

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> LinearBackend:
        raise NotImplementedError

    def verify(self) -> None:
        """Check that what the backend derived from the weights still holds; by default it derives nothing."""

    def to_linear(self) -> nn.Linear:
        """The linear layer this backend was made from."""
        return self.__dict__["_source"]

    def _adopt(self, linear: nn.Linear) -> None:
        """Take ``linear``'s shape and its very parameters, and remember it for ``to_linear``."""
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.register_parameter("bias", linear.bias)
        self.__dict__["_source"] = linear  # not a submodule: its parameters are these


def fastest_of_rounds(calls: dict, rounds: int = 5, repeats: int = 10) -> dict:
    """Each call's fastest time over ``rounds`` rounds of ``repeats`` calls, the calls taking turns within a
    round (after one call each): on a busy host another process slows some rounds, and the fastest round of
    each, measured side by side, compares the ways as they run on a quiet one. A call three times slower than
    the fastest after the first round is out of the race (its time stays that round's)."""
    for call in calls.values():
        call()
    best = dict.fromkeys(calls, float("inf"))
    for round_index in range(rounds):
        for key, call in calls.items():
            if round_index and best[key] > 3 * min(best.values()):
                continue
            started = time.perf_counter()
            for _ in range(repeats):
                call()
            best[key] = min(best[key], time.perf_counter() - started)
    return best
