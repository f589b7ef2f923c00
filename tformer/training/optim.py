"""AdamW with decoupled weight decay applied to weight matrices only: not to norms, biases or,
by default, embedding tables (nanoGPT decays those too: ``decay_embeddings=True``). LoRA adapters' matrices
are weight matrices: they decay, as Hugging Face's Trainer decays them. A group may carry ``lr_scale``: the
schedule's rate is multiplied by it for that group (T5's relative position bias, ``position_bias_lr_scale``)."""

from __future__ import annotations

import torch
from torch import nn

from tformer.nn.positions.biases import RelativePositionBias
from tformer.nn.weights.lora import LoraLinear
from tformer.training.config import TrainingError


def parameter_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False,
                     position_bias_lr_scale: float = 1.0) -> list[dict]:
    """Two groups: weight matrices of Linear layers and LoRA adapters (and embedding tables when
    ``decay_embeddings``) decay; everything else (norm scales, biases, embeddings, position
    tables) does not. A tied tensor is listed once. With ``position_bias_lr_scale`` other than 1, the
    relative position bias tables form a third group (no decay) whose rate is scaled by it; a model
    without one refuses the scale."""
    scaled = position_bias_tables(model) if position_bias_lr_scale != 1.0 else []
    if position_bias_lr_scale != 1.0 and not scaled:
        raise TrainingError(f"training.position_bias_lr_scale={position_bias_lr_scale} scales a learned relative "
                           "position bias (model.positional = \"relative\"); this model has no trainable one")
    scaled_ids = {id(parameter) for parameter in scaled}
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    adapter_ids = {id(p) for m in model.modules() if isinstance(m, LoraLinear) for p in (*m.lora_A, *m.lora_B)}
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen or id(parameter) in scaled_ids:
                continue
            seen.add(id(parameter))
            is_embedding = id(parameter) in embedding_ids
            is_matrix = (isinstance(module, nn.Linear) and name == "weight" and not is_embedding) or \
                id(parameter) in adapter_ids
            (decay if is_matrix or (is_embedding and decay_embeddings) else no_decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if scaled:
        groups.append({"params": scaled, "weight_decay": 0.0, "lr_scale": position_bias_lr_scale})
    return groups


def position_bias_tables(model: nn.Module) -> list[nn.Parameter]:
    """The trainable tables of the model's relative position biases (T5's, one per stack)."""
    return [parameter for module in model.modules() if isinstance(module, RelativePositionBias)
            for parameter in module.parameters() if parameter.requires_grad]


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8, decay_embeddings: bool = False, fused: bool = True, position_bias_lr_scale: float = 1.0,
) -> torch.optim.AdamW:
    """AdamW over ``parameter_groups``, by default through PyTorch's fused kernel (CPU and CUDA)."""
    groups = parameter_groups(model, weight_decay, decay_embeddings, position_bias_lr_scale)
    for group in groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)
