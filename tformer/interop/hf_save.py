"""``save_hf``: a tformer model as a Hugging Face checkpoint folder that ``from_pretrained`` loads."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file
from torch import nn

from tformer.checkpoint import CONFIG_NAME, write_checkpoint_folder
from tformer.interop.families import family_for_config
from tformer.interop.hf_files import SAFETENSORS_NAME
from tformer.interop.hf_load import HF_TOKENIZER_NAME
from tformer.interop.marian import marian_equivalent
from tformer.interop.weight_map import tformer_to_hf, weight_rules


def save_hf(model: nn.Module, path: str | Path) -> Path:
    """Write ``model`` (a tformer Model) as config.json + model.safetensors (+ tokenizer.json, + a vision
    model's preprocessor_config.json) in Hugging Face's format for the family that represents its config,
    in the model's dtype.

    Raises CheckpointError, before writing anything, when no family represents the config.
    Written like tformer's own checkpoints (``write_checkpoint_folder``): a new folder appears
    whole or not at all; into an existing one, config.json is replaced last.
    """
    model = marian_equivalent(model)  # a model trained with the paper's positions is laid out as Marian's
    family = family_for_config(model.config)
    rules = weight_rules(family.module_map(model.config), model)
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    hf_state = family.saved_state(tformer_to_hf(state, rules), model.config)
    hf_config = {**family.config_to_hf(model.config), "dtype": str(model.dtype).removeprefix("torch.")}
    tokenizer = getattr(model, "tokenizer", None)
    image_processor = getattr(model, "image_processor", None)

    def write(folder: Path) -> None:
        save_file(hf_state, str(folder / SAFETENSORS_NAME), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(folder / HF_TOKENIZER_NAME)
        if image_processor is not None:
            image_processor.save(folder)
        (folder / CONFIG_NAME).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")

    return write_checkpoint_folder(path, write)
