"""What crosses between the engine and the HTTP side: a sequence's token events, the prompt scores they may carry,
an embeddings request's vectors, and the engine's counters. Plain dataclasses that import neither torch nor
``tformer.nn``, so the HTTP process (and the pickles the engine process sends it) can read them without loading the
model's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PromptLogprobs:
    """A prompt scored by the model: for each prompt token after the first, its log-probability given the
    tokens before it, and the ``k`` most likely tokens there (id, log-probability), best first."""

    token_logprobs: list[float]  # (T - 1,) prompt tokens 1 .. T-1
    top_logprobs: list[list[tuple[int, float]]]  # (T - 1, k)


@dataclass
class TokenEvent:
    """What one step produced for one sequence: its new token and the text it completes."""

    request: Any  # the engine's ``Request``; None in the copy that leaves the engine (``engine_client.detached``)
    index: int  # which of the request's ``n`` sequences
    token_id: int
    text: str  # new text (held back while it may be the start of a stop string or a character)
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None  # set on the sequence's last event
    prompt_logprobs: PromptLogprobs | None = None  # on the sequence's first event, when the request asked


@dataclass(frozen=True)
class EmbeddingFacts:
    """How the served model embeds (``tformer.pooling.Pooling``, as the HTTP process reads it): its pooling
    mode, whether vectors are scaled to unit length, where that choice came from, the vectors' size and the
    most tokens an input may have (None: unbounded)."""

    pooling: str
    normalize: bool
    source: str
    dimensions: int
    max_tokens: int | None


@dataclass
class Embeddings:
    """One embeddings request's answer: each input's vector as little-endian float32 bytes (what OpenAI's base64
    encoding sends), or why there is none (``error``: it was cancelled)."""

    vectors: list[bytes]
    error: str | None = None


@dataclass
class EngineStats:
    """Counters for /metrics."""

    requests_submitted: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_timed_out: int = 0
    prompt_tokens: int = 0  # of admitted requests, once per request
    prompt_tokens_computed: int = 0  # prompt tokens the model ran, every sequence's
    prefix_cache_hit_tokens: int = 0  # prompt tokens whose keys and values were found in the prefix cache
    generated_tokens: int = 0
    steps: int = 0
    embedding_requests: int = 0  # embeddings requests answered (vectors, not refusals or cancellations)
    embedded_inputs: int = 0  # inputs embedded
    embedded_tokens: int = 0  # their tokens

    @property
    def prefix_cache_hit_rate(self) -> float:
        """The share of admitted prompt tokens served from the prefix cache (0 before any)."""
        return self.prefix_cache_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
