"""tformer: the transformer family in one PyTorch library and one command-line tool.

The public names load on first use (PEP 562): ``tformer.load``, ``from tformer import generate``, ``tformer.nn``
and the rest work as before, while a module imported by its own name that needs little (``tformer.serving.server``,
``tformer.tokenizers``) loads without the model's libraries. The registries a config is checked against fill
themselves when a config is first made (``families.ensure_declared``), whichever module was imported first.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tformer import tokenizers
    from tformer.config import PRESETS, ConfigError, ModelConfig
    from tformer.data.image_processing import ImageProcessing
    from tformer.generation import GenerationConfig, generate, stream_generate
    from tformer.generation.translation import translate
    from tformer.hub import embed, load, save
    from tformer.hub_cache import download
    from tformer.models import (
        DecoderLM,
        EncoderDecoderLM,
        EncoderModel,
        EncoderOutput,
        Model,
        ModelOutput,
        RNNSeq2Seq,
        SpeechModel,
        VisionModel,
        VisionOutput,
        build_model,
    )

__version__ = "0.1.0"

# name -> the module that defines it
EXPORTS = {
    "PRESETS": "tformer.config", "ConfigError": "tformer.config", "ModelConfig": "tformer.config",
    "ImageProcessing": "tformer.data.image_processing",
    "GenerationConfig": "tformer.generation", "generate": "tformer.generation",
    "stream_generate": "tformer.generation", "translate": "tformer.generation.translation",
    "load": "tformer.hub", "save": "tformer.hub", "download": "tformer.hub_cache", "embed": "tformer.hub",
    **dict.fromkeys(["DecoderLM", "EncoderDecoderLM", "EncoderModel", "EncoderOutput", "Model", "ModelOutput",
                     "RNNSeq2Seq", "SpeechModel", "VisionModel", "VisionOutput", "build_model"], "tformer.models"),
}

__all__ = [
    "PRESETS", "ConfigError", "DecoderLM", "EncoderDecoderLM", "EncoderModel", "EncoderOutput", "GenerationConfig",
    "ImageProcessing", "Model", "ModelConfig", "ModelOutput", "RNNSeq2Seq", "SpeechModel", "VisionModel",
    "VisionOutput", "build_model", "download", "embed", "generate", "load", "save", "stream_generate", "tokenizers",
    "translate", "__version__",
]


def __getattr__(name: str) -> object:
    """An exported name, or a submodule (``tformer.nn``), imported the first time it is asked for."""
    if name in EXPORTS:
        value = getattr(importlib.import_module(EXPORTS[name]), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
