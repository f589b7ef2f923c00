"""Reading a Hugging Face checkpoint folder: its config as a ModelConfig (``hf_config``), then
its weights into a model built from that config (``load_hf_weights``), all checks before any
copy. ``tformer.hub.load`` builds the model in between: interop knows no model class."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tformer.checkpoint import (
    CONFIG_NAME,
    CheckpointError,
    HeadChanges,
    head_changes,
    load_state,
    read_attached_tokenizer,
)
from tformer.config import ModelConfig
from tformer.errors import TformerError
from tformer.interop.families import family_for_model_type
from tformer.interop.family import Family
from tformer.interop.hf_files import read_hf_weights
from tformer.interop.weight_map import hf_to_tformer, weight_rules

HF_TOKENIZER_NAME = "tokenizer.json"
GPT2_TOKENIZER_NAMES = ("vocab.json", "merges.txt")
BERT_VOCAB_NAME = "vocab.txt"  # a BERT/WordPiece folder's vocabulary (with tokenizer_config.json's casing)


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


def load_hf_weights(model: nn.Module, family: Family, folder: Path, new_head: bool = False) -> HeadChanges:
    """Fill ``model`` (built from ``hf_config``'s config) with the folder's weights.

    Raises CheckpointError for missing or unexpected weights, or a shape that does not match
    the config; weights are copied only after every check passed. Weights of task heads the model
    lacks (``family.head_prefixes``) are dropped; with ``new_head`` (a fine-tuning load) the model's
    head weights that the folder lacks keep their initialisation. Returns both: the dropped ones by
    their Hugging Face names, the initialised ones by tformer's.
    """
    hf_state, source = read_hf_weights(folder)
    hf_state = family.normalized_state(hf_state, model.config)
    rules = weight_rules(family.module_map(model.config), model)
    our_shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    expected = {their: shape for rule in rules
                for their, shape in zip(rule.theirs, rule.their_shapes(our_shapes[rule.ours]), strict=True)}
    changes = head_changes(expected, {name: tuple(t.shape) for name, t in hf_state.items()},
                           lambda name: name.startswith(family.head_prefixes), new_head)
    hf_state = {name: tensor for name, tensor in hf_state.items() if name not in changes.dropped}
    kept = [rule for rule in rules if not set(rule.theirs) & set(changes.initialised)]
    loaded = load_state(model, hf_to_tformer(hf_state, kept, our_shapes, source), source, new_head=new_head)
    return HeadChanges(initialised=loaded.initialised, dropped=changes.dropped)


def attached_tokenizer(folder: Path):
    """The tokenizer stored with a checkpoint (``tokenizer.json``, else GPT-2's vocab.json +
    merges.txt, else BERT's vocab.txt), or None. A tokenizer tformer cannot read is reported by a
    warning, not an error: the weights are still usable with token ids."""
    if (folder / HF_TOKENIZER_NAME).is_file():
        source = folder / HF_TOKENIZER_NAME
    elif all((folder / name).is_file() for name in GPT2_TOKENIZER_NAMES) or (folder / BERT_VOCAB_NAME).is_file():
        source = folder
    else:
        return None
    return read_attached_tokenizer(source, folder)
