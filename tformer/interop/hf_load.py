"""Reading a Hugging Face checkpoint folder: its config as a ModelConfig (``hf_config``), then
its weights into a model built from that config (``load_hf_weights``), all checks before any
copy. ``tformer.hub.load`` builds the model in between: interop knows no model class."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tformer.checkpoint import CONFIG_NAME, CheckpointError, load_state, read_attached_tokenizer
from tformer.config import ModelConfig
from tformer.errors import TformerError
from tformer.interop.families import family_for_model_type
from tformer.interop.family import Family
from tformer.interop.hf_files import read_hf_weights
from tformer.interop.weight_map import hf_to_tformer, weight_rules

HF_TOKENIZER_NAME = "tokenizer.json"
GPT2_TOKENIZER_NAMES = ("vocab.json", "merges.txt")


def hf_config(folder: Path, raw: object) -> tuple[Family, ModelConfig]:
    """The family and ModelConfig of a Hugging Face folder's parsed config.json ``raw``.

    Raises CheckpointError for an unsupported family or feature, or a value of the wrong type.
    """
    if not isinstance(raw, dict):
        raise CheckpointError(f"{folder / CONFIG_NAME}: not a JSON object")
    family = family_for_model_type(raw.get("model_type"))
    try:
        return family, family.config_from_hf(raw)
    except (TformerError, TypeError, ValueError) as error:  # unsupported features, values of the wrong type
        raise CheckpointError(f"{folder / CONFIG_NAME}: {error}") from None


def load_hf_weights(model: nn.Module, family: Family, folder: Path) -> None:
    """Fill ``model`` (built from ``hf_config``'s config) with the folder's weights.

    Raises CheckpointError for missing or unexpected weights, or a shape that does not match
    the config; weights are copied only after every check passed.
    """
    hf_state, source = read_hf_weights(folder)
    hf_state = family.normalized_state(hf_state, model.config)
    rules = weight_rules(family.modules, model)
    our_shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    load_state(model, hf_to_tformer(hf_state, rules, our_shapes, source), source)


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
    return read_attached_tokenizer(source, folder)
