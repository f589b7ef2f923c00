"""Model classes by architecture, and ``build_model``. Importing this package registers every family."""

from __future__ import annotations

from tformer.models.base import Model
from tformer.models.decoder import DecoderLM
from tformer.models.encoder import EncoderModel
from tformer.models.encoder_decoder import EncoderDecoderLM
from tformer.models.generation_protocol import GenerationProtocol
from tformer.models.output import EncoderOutput, ModelOutput, Seq2SeqOutput, VisionOutput
from tformer.models.registry import MODEL_CLASSES, build_model, model_class, register
from tformer.models.rnn_seq2seq import RNNSeq2Seq
from tformer.models.speech import SpeechModel
from tformer.models.vision import VisionModel

__all__ = [
    "DecoderLM", "EncoderDecoderLM", "EncoderModel", "EncoderOutput", "GenerationProtocol", "MODEL_CLASSES", "Model",
    "ModelOutput", "RNNSeq2Seq", "Seq2SeqOutput", "SpeechModel", "build_model", "model_class", "register",
    "VisionModel", "VisionOutput",
]
