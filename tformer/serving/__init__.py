"""Serving: continuous batching over a paged key/value cache, behind an OpenAI-compatible HTTP server.

The engine's names load on first use (PEP 562), so the HTTP side (``serving.server``, ``serving.engine_process``)
imports without torch: the engine and the model run in a process of their own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tformer.serving.engine import Engine
    from tformer.serving.requests import Request
    from tformer.serving.wire import TokenEvent

# name -> the module that defines it
EXPORTS = {"Engine": "tformer.serving.engine", "Request": "tformer.serving.requests",
           "TokenEvent": "tformer.serving.wire"}

__all__ = ["Engine", "Request", "TokenEvent"]


def __getattr__(name: str) -> object:
    """Import the module of an exported name the first time it is asked for."""
    if name not in EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
