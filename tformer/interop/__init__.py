"""Hugging Face checkpoints in and out: ``hf_config`` + ``load_hf_weights`` read a folder with a
supported ``model_type`` (``tformer.load`` builds the model between the two), ``save_hf``
writes one that ``from_pretrained`` loads.

Families: see ``SUPPORTED_MODEL_TYPES``. A family is a config translation and a key map
(``tformer.interop.family``); the weights land in the one shared core.
"""

from tformer.interop.families import SUPPORTED_MODEL_TYPES, family_for_config, family_for_model_type
from tformer.interop.hf_load import attached_tokenizer, hf_config, load_hf_weights
from tformer.interop.hf_save import save_hf

__all__ = [
    "SUPPORTED_MODEL_TYPES", "attached_tokenizer", "family_for_config", "family_for_model_type", "hf_config",
    "load_hf_weights", "save_hf",
]
