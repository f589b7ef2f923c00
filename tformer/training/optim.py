"""AdamW with decoupled weight decay applied only to matrices (not norms, biases or embeddings)."""

from __future__ import annotations

import torch
from torch import nn


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weight matrices of Linear layers decay; everything else (norm scales, biases,
    embeddings, position tables) does not. A tied tensor is listed once."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            is_matrix = isinstance(module, nn.Linear) and name == "weight"
            tied_to_embedding = any(parameter is m.weight for m in model.modules() if isinstance(m, nn.Embedding))
            (decay if is_matrix and not tied_to_embedding else no_decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW over ``parameter_groups``, using PyTorch's fused kernel (CPU and CUDA)."""
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, fused=True)
