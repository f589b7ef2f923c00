"""Decoding: greedy, sampling, beam search, speculative decoding, streaming, over a KV cache."""

from tformer.generation.generate import TokenStream, generate, stream_generate
from tformer.generation.output import GenerationOutput
from tformer.generation.session import DecoderSession, cache_bytes_per_token
from tformer.generation.settings import GenerationError
from tformer.generation.stream import TextStreamer

__all__ = [
    "DecoderSession", "GenerationError", "GenerationOutput", "TextStreamer", "TokenStream",
    "cache_bytes_per_token", "generate", "stream_generate",
]
