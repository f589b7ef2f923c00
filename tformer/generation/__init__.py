"""Decoding: greedy, sampling, beam search, speculative decoding, streaming, over a KV cache.

Names load on first use (PEP 562): importing a light module of the package (``generation.settings``,
``generation.detokenize``, as the HTTP server does) does not import the decoding code and torch with it.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tformer.generation.generate import TokenStream, generate, stream_generate
    from tformer.generation.output import GenerationOutput
    from tformer.generation.session import (
        GenerationState,
        ModelSession,
        Session,
        StackSession,
        StaticSession,
        open_session,
    )
    from tformer.generation.settings import GenerationConfig, GenerationError
    from tformer.generation.stream import TextStreamer
    from tformer.generation.transcription import audio_windows, transcribe_ids

# name -> the module that defines it
EXPORTS = {
    "TokenStream": "generate", "generate": "generate", "stream_generate": "generate",
    "GenerationOutput": "output",
    "GenerationState": "session", "ModelSession": "session", "Session": "session", "StackSession": "session",
    "StaticSession": "session", "open_session": "session",
    "GenerationConfig": "settings", "GenerationError": "settings",
    "TextStreamer": "stream",
    "audio_windows": "transcription", "transcribe_ids": "transcription",
}

__all__ = [
    "GenerationConfig", "GenerationError", "GenerationOutput", "GenerationState", "ModelSession", "Session",
    "StackSession", "StaticSession", "TextStreamer", "TokenStream", "audio_windows", "generate",
    "open_session", "stream_generate", "transcribe_ids",
]


def __getattr__(name: str) -> object:
    """Import the module of an exported name the first time it is asked for."""
    if name not in EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """This package, whose exported names stay what they name when a submodule of the same name loads: the
    import system sets a package's attribute to each submodule it imports, and ``generate`` is both."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
