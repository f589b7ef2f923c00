"""tformer: the transformer family in one PyTorch library and one command-line tool."""

from tformer import tokenizers
from tformer.config import PRESETS, ConfigError, ModelConfig
from tformer.data.image_processing import ImageProcessing
from tformer.generation import GenerationConfig, generate, stream_generate
from tformer.generation.translation import translate
from tformer.hub import load, save
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

__all__ = [
    "PRESETS", "ConfigError", "DecoderLM", "EncoderDecoderLM", "EncoderModel", "EncoderOutput", "GenerationConfig",
    "ImageProcessing", "Model", "ModelConfig", "ModelOutput", "RNNSeq2Seq", "SpeechModel", "VisionModel",
    "VisionOutput", "build_model", "download", "generate", "load", "save", "stream_generate", "tokenizers",
    "translate", "__version__",
]
