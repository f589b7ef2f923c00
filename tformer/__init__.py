"""tformer: the transformer family in one PyTorch library and one command-line tool."""

from tformer import tokenizers
from tformer.config import PRESETS, ConfigError, ModelConfig
from tformer.data.image_processing import ImageProcessing
from tformer.generation import GenerationConfig, generate, stream_generate
from tformer.hub import load, save
from tformer.hub_cache import download
from tformer.models import (
    DecoderLM,
    EncoderModel,
    EncoderOutput,
    Model,
    ModelOutput,
    VisionModel,
    VisionOutput,
    build_model,
)

__version__ = "0.1.0"

__all__ = [
    "PRESETS", "ConfigError", "DecoderLM", "EncoderModel", "EncoderOutput", "GenerationConfig", "ImageProcessing",
    "Model", "ModelConfig", "ModelOutput", "VisionModel", "VisionOutput",
    "build_model", "download", "generate", "load", "save", "stream_generate", "tokenizers", "__version__",
]
