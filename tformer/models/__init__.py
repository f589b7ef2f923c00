"""Model classes by architecture, and ``build_model``."""

from __future__ import annotations

from typing import Any

from tformer.config import ModelConfig, resolve_config
from tformer.models.base import Model
from tformer.models.decoder import DecoderLM
from tformer.models.output import ModelOutput

MODEL_CLASSES: dict[str, type[Model]] = {"decoder": DecoderLM}


def model_class(config: ModelConfig) -> type[Model]:
    """The class that implements ``config.architecture``."""
    return MODEL_CLASSES[config.architecture]


def build_model(config_or_preset: ModelConfig | str, **overrides: Any) -> Model:
    """A freshly initialised model from a ModelConfig or a preset name, with field overrides.

    >>> model = build_model("gpt-nano", vocab_size=100)
    """
    config = resolve_config(config_or_preset, **overrides)
    return model_class(config)(config)


__all__ = ["DecoderLM", "Model", "ModelOutput", "build_model", "model_class", "MODEL_CLASSES"]
