"""Hugging Face checkpoints in and out: ``load_hf`` reads a folder with a supported
``model_type`` into a tformer model, ``save_hf`` writes one that ``from_pretrained`` loads.

Families: see ``SUPPORTED_MODEL_TYPES``. A family is a config translation and a key map
(``tformer.interop.family``); the weights land in the one shared core.
"""

from tformer.interop.families import SUPPORTED_MODEL_TYPES, family_for_config, family_for_model_type
from tformer.interop.hf_load import load_hf
from tformer.interop.hf_save import save_hf

__all__ = ["SUPPORTED_MODEL_TYPES", "family_for_config", "family_for_model_type", "load_hf", "save_hf"]
