"""Serving: continuous batching over a paged key/value cache, behind an OpenAI-compatible HTTP server.

The engine's names load on first use (PEP 562), so the HTTP side (``serving.server``, ``serving.engine_process``)
imports without torch: the engine and the model run in a process of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tformer.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from tformer.serving.engine import Engine
    from tformer.serving.requests import Request
    from tformer.serving.wire import TokenEvent

# name -> the module that defines it
EXPORTS = {"Engine": "tformer.serving.engine", "Request": "tformer.serving.requests",
           "TokenEvent": "tformer.serving.wire"}

__all__ = ["Engine", "Request", "TokenEvent"]

__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
