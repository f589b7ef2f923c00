"""Normalisation layers: LayerNorm (with or without bias), RMSNorm, and RMSNorm scaled by one plus its weight.

Both read their parameters straight from the module's parameter table: a decoding step runs every
norm of the model once per token, and nn.Module's attribute lookup costs more than the norm of one row.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (the same parameters and state-dict names), with a lean forward."""

    def forward(self, x: Tensor) -> Tensor:
        parameters = self._parameters
        return torch.layer_norm(x, self.normalized_shape, parameters["weight"], parameters["bias"], self.eps)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned scale (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.shape = (dim,)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return torch.rms_norm(x, self.shape, self._parameters["weight"], self.eps)


class RMSNormPlusOne(RMSNorm):
    """RMSNorm scaled by ``1 + weight`` (the weight starts at zero), computed in float32 and cast back after the
    scale (Gemma's: the scale multiplies before the cast to a lower precision, not after)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        normed = torch.rms_norm(x.float(), self.shape, None, self.eps)
        return (normed * (1.0 + self._parameters["weight"].float())).to(x.dtype)


def build_norm(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    """A normalisation layer by name: ``layernorm``, ``rmsnorm`` or ``rmsnorm_plus_one``."""
    if kind == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    if kind == "rmsnorm_plus_one":
        return RMSNormPlusOne(dim, eps=eps)
    raise ValueError(f"norm={kind!r} is not one of layernorm, rmsnorm, rmsnorm_plus_one")
