"""Decoding: greedy, sampling, beam search, speculative decoding, streaming, over a KV cache."""

from tformer.generation.generate import TokenStream, generate, stream_generate
from tformer.generation.output import GenerationOutput
from tformer.generation.session import (
    GenerationState,
    ModelSession,
    Session,
    StackSession,
    cache_bytes_per_token,
    open_session,
)
from tformer.generation.settings import GenerationConfig, GenerationError
from tformer.generation.stream import TextStreamer
from tformer.generation.transcription import audio_windows, transcribe_ids

__all__ = [
    "GenerationConfig", "GenerationError", "GenerationOutput", "GenerationState", "ModelSession", "Session",
    "StackSession", "TextStreamer", "TokenStream", "audio_windows", "cache_bytes_per_token", "generate",
    "open_session", "stream_generate", "transcribe_ids",
]
