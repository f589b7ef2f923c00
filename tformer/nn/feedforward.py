"""The position-wise feed-forward network: two projections around an activation, or a gated
linear unit (SwiGLU / GeGLU, exact or tanh GELU) whose gate and value projections are one fused matrix."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from tformer.choices import ACTIVATIONS


@dataclass(frozen=True)
class Activation:
    """An activation a config may name (``activation``): its elementwise function (a gated kind's: the one on its
    gate) and whether it is a gated linear unit (a gate and an up projection, one fused matrix)."""

    name: str
    function: Callable[[Tensor], Tensor]
    gated: bool = False


ACTIVATIONS.register(
    Activation("relu", F.relu),
    Activation("gelu", F.gelu),
    Activation("gelu_tanh", partial(F.gelu, approximate="tanh")),
    Activation("silu", F.silu),
    Activation("swiglu", F.silu, gated=True),
    Activation("geglu", F.gelu, gated=True),
    Activation("geglu_tanh", partial(F.gelu, approximate="tanh"), gated=True),  # T5 v1.1's
)
GATED_ACTIVATIONS = tuple(name for name, activation in ACTIVATIONS.items() if activation.gated)


def activation_function(name: str) -> Callable[[Tensor], Tensor]:
    """The elementwise function of an activation name (a gated kind's: the one applied to its gate)."""
    problem = ACTIVATIONS.problem(name)
    if problem is not None:
        raise ValueError(problem)
    return ACTIVATIONS[name].function


class FeedForward(nn.Module):
    """``out_proj(act(in_proj(x)))``, or for gated kinds ``out_proj(act(gate) * up)``.

    For gated kinds ``in_proj`` has 2 * d_ff outputs: the gate first, then the up projection.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool = True) -> None:
        super().__init__()
        self.activation = activation_function(activation)
        self.gated = activation in GATED_ACTIVATIONS
        self.in_proj = nn.Linear(d_model, 2 * d_ff if self.gated else d_ff, bias=bias)
        self.out_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., D) -> (..., D)."""
        projections = self._modules  # read directly: a decoding step runs every layer once per token
        hidden = projections["in_proj"](x)
        hidden = self.activate(hidden) if self.gated else self.activation(hidden)
        return projections["out_proj"](hidden)

    def activate(self, hidden: Tensor) -> Tensor:
        """The activation between the projections: (..., d_ff or 2 * d_ff) -> (..., d_ff)."""
        if self.gated:
            gate, up = hidden.chunk(2, dim=-1)
            return self.activation(gate) * up
        return self.activation(hidden)
