"""Serving: continuous batching over a paged key/value cache, behind an OpenAI-compatible HTTP server."""

from tformer.serving.engine import Engine, Request, TokenEvent

__all__ = ["Engine", "Request", "TokenEvent"]
