"""``load`` and ``save``: checkpoint folders in tformer's format or Hugging Face's, the one entry
that sits above model classes, interop and checkpoint files (none of them imports this)."""

from __future__ import annotations

from pathlib import Path

import torch

from tformer.checkpoint import (
    CONFIG_NAME,
    CheckpointError,
    config_from_checkpoint,
    is_hf_config,
    load_attached_tokenizer,
    load_weights,
    read_config,
)
from tformer.config import ModelConfig
from tformer.interop import attached_tokenizer, hf_config, load_hf_weights
from tformer.memory import model_bytes, require_memory
from tformer.models import Model, model_class


def load(path: str | Path, device: str | torch.device = "cpu") -> Model:
    """Load a checkpoint folder (tformer's format, or Hugging Face's when config.json has a
    ``model_type``) into a model in eval mode, with its tokenizer attached when it has one."""
    folder = Path(path)
    raw = read_config(folder)
    if is_hf_config(raw):
        family, config = hf_config(folder, raw)
        model = _build(config, folder)
        load_hf_weights(model, family, folder)
        model.tokenizer = attached_tokenizer(folder)
    else:
        config = config_from_checkpoint(raw)
        model = _build(config, folder)
        load_weights(model, folder)
        model.tokenizer = load_attached_tokenizer(folder)
    return model.to(device).eval()


def _build(config: ModelConfig, folder: Path) -> Model:
    """The model of ``config``, once its memory has been found to fit: loading holds it and the
    weights read from the file, about twice its size."""
    require_memory(2 * model_bytes(config), "cpu", f"{folder / CONFIG_NAME}: loading its model "
                   f"(vocab_size={config.vocab_size}, d_model={config.d_model}, num_layers={config.num_layers})",
                   CheckpointError)
    return model_class(config)(config)


def save(model: Model, path: str | Path, format: str = "tformer") -> Path:
    """Write ``model`` as a checkpoint folder: ``format="tformer"`` or ``"hf"`` (see ``Model.save``)."""
    return model.save(path, format=format)
