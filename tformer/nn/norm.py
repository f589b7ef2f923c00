"""Normalisation layers: LayerNorm (with or without bias) and RMSNorm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned scale (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def build_norm(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    """A normalisation layer by name: ``layernorm`` or ``rmsnorm``."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    raise ValueError(f"norm={kind!r} is not one of layernorm, rmsnorm")
