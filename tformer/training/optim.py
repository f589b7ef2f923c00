"""AdamW with decoupled weight decay applied to weight matrices only: not to norms, biases or,
by default, embedding tables (nanoGPT decays those too: ``decay_embeddings=True``). LoRA adapters' matrices
are weight matrices: they decay, as Hugging Face's Trainer decays them."""

from __future__ import annotations

import torch
from torch import nn

from tformer.nn.weights.lora import LoraLinear


def parameter_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict]:
    """Two groups: weight matrices of Linear layers and LoRA adapters (and embedding tables when
    ``decay_embeddings``) decay; everything else (norm scales, biases, embeddings, position
    tables) does not. A tied tensor is listed once."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    adapter_ids = {id(p) for m in model.modules() if isinstance(m, LoraLinear) for p in (*m.lora_A, *m.lora_B)}
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            is_embedding = id(parameter) in embedding_ids
            is_matrix = (isinstance(module, nn.Linear) and name == "weight" and not is_embedding) or \
                id(parameter) in adapter_ids
            (decay if is_matrix or (is_embedding and decay_embeddings) else no_decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8, decay_embeddings: bool = False, fused: bool = True,
) -> torch.optim.AdamW:
    """AdamW over ``parameter_groups``, by default through PyTorch's fused kernel (CPU and CUDA)."""
    groups = parameter_groups(model, weight_decay, decay_embeddings)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)
