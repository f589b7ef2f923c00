"""Model classes by architecture: ``register`` a family's class, ``model_class`` finds it,
``build_model`` makes a freshly initialised one from a config or a preset name."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tformer.config import ConfigError, ModelConfig, resolve_config
from tformer.families import declare_family
from tformer.models.base import Model

MODEL_CLASSES: dict[str, type[Model]] = {}


def register(architecture: str, fields: Iterable[str] = (), check: Callable[[ModelConfig], None] | None = None,
             transformer: bool = True, presets: Mapping[str, Mapping[str, Any]] | None = None,
             longest_sequence: Callable[[ModelConfig], int] | None = None) -> Callable[[type[Model]], type[Model]]:
    """Class decorator: the class implements the family ``architecture``, which reads ``fields`` of the
    fields only some families read (config.TOKEN_FIELDS, ...), is checked by ``check`` beside the core's
    checks, is built from the shared stack unless ``transformer`` is False, names ``presets`` (each a dict of
    config fields: ``tformer.PRESETS``), and says the ``longest_sequence`` its stacks attend over where that is
    not ``max_seq_len`` (tformer/families.py)."""

    def add(cls: type[Model]) -> type[Model]:
        if architecture in MODEL_CLASSES and MODEL_CLASSES[architecture] is not cls:
            raise ValueError(f"architecture {architecture!r} is already implemented by "
                             f"{MODEL_CLASSES[architecture].__name__}")
        declare_family(architecture, fields, check, transformer, presets, longest_sequence)
        MODEL_CLASSES[architecture] = cls
        return cls

    return add


def model_class(config: ModelConfig) -> type[Model]:
    """The class that implements ``config.architecture``."""
    try:
        return MODEL_CLASSES[config.architecture]
    except KeyError:
        raise ConfigError(
            f"architecture={config.architecture!r} has no model class; implemented: {', '.join(MODEL_CLASSES)}"
        ) from None


def build_model(config_or_preset: ModelConfig | str, **overrides: Any) -> Model:
    """A freshly initialised model from a ModelConfig or a preset name, with field overrides.

    >>> model = build_model("gpt-nano", vocab_size=100)
    """
    config = resolve_config(config_or_preset, **overrides)
    return model_class(config)(config)


def model_bytes(config: ModelConfig, element_size: int = 4) -> int:
    """About how many bytes a model of ``config`` holds (its family's ``estimated_parameters``)."""
    return model_class(config).estimated_parameters(config) * element_size
