"""Serving: continuous batching over a paged key/value cache, behind an OpenAI-compatible HTTP server."""

from tformer.serving.engine import Engine, Request, TokenEvent
from tformer.serving.paged_cache import BlockPool, BlockTable
from tformer.serving.paged_decoder import PagedDecoder, PagedStep

__all__ = ["BlockPool", "BlockTable", "Engine", "PagedDecoder", "PagedStep", "Request", "TokenEvent"]
