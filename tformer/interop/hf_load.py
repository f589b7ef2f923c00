"""``load_hf``: a Hugging Face checkpoint folder into a tformer model, all checks before any copy."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from tformer.checkpoint import CONFIG_NAME, CheckpointError, load_state, read_config
from tformer.errors import TformerError
from tformer.interop.families import family_for_model_type
from tformer.interop.hf_files import read_hf_weights
from tformer.interop.weight_map import hf_to_tformer, weight_rules
from tformer.models import Model, model_class

HF_TOKENIZER_NAME = "tokenizer.json"
GPT2_TOKENIZER_NAMES = ("vocab.json", "merges.txt")


def load_hf(path: str | Path, device: str | torch.device = "cpu") -> Model:
    """Load a Hugging Face checkpoint folder (config.json with a supported ``model_type`` and its
    weights) into a tformer model in eval mode, float32, with its tokenizer attached if it has one.

    Raises CheckpointError for an unsupported family or feature, missing or unexpected weights,
    or a shape that does not match the config; weights are copied only after every check passed.
    """
    folder = Path(path)
    raw = read_config(folder)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{folder / CONFIG_NAME}: not a JSON object")
    family = family_for_model_type(raw.get("model_type"))
    try:
        config = family.config_from_hf(raw)
    except (TformerError, TypeError, ValueError) as error:  # unsupported features, values of the wrong type
        raise CheckpointError(f"{folder / CONFIG_NAME}: {error}") from None

    model = model_class(config)(config)
    hf_state, source = read_hf_weights(folder)
    hf_state = family.normalized_state(hf_state, config)
    rules = weight_rules(family.modules, model)
    our_shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    load_state(model, hf_to_tformer(hf_state, rules, our_shapes, source), source)
    model.tokenizer = attached_tokenizer(folder)
    return model.to(device).eval()


def attached_tokenizer(folder: Path):
    """The tokenizer stored with a checkpoint (``tokenizer.json``, else GPT-2's vocab.json +
    merges.txt), or None. A tokenizer tformer cannot read is reported by a warning, not an error:
    the weights are still usable with token ids."""
    if (folder / HF_TOKENIZER_NAME).is_file():
        source = folder / HF_TOKENIZER_NAME
    elif all((folder / name).is_file() for name in GPT2_TOKENIZER_NAMES):
        source = folder
    else:
        return None
    from tformer.tokenizers import TokenizerError
    from tformer.tokenizers import load as load_tokenizer

    try:
        return load_tokenizer(source)
    except TokenizerError as error:
        warnings.warn(f"{folder}: tokenizer not attached: {error}", stacklevel=3)
        return None
