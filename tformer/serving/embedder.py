"""The engine's embeddings: requests of token ids queued from any thread, embedded in padded batches inside the
engine's steps (``models.embeddings.embed_ids``: one forward a batch, padding masked out), so many requests share
one forward instead of one each.

A step takes waiting inputs first come, first served (a request's inputs may span steps) while the padded batch,
inputs x the longest of them, stays within ``max_batch_tokens`` (one input longer than that runs alone). A
request is answered (``on_done``) once its last input is embedded; a cancelled one is answered at the next
step with ``error`` "cancelled" and its inputs are dropped.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn

from tformer.generation.settings import GenerationError
from tformer.models.embeddings import check_ids, embed_ids, max_input_tokens
from tformer.pooling import EmbeddingError, Pooling
from tformer.serving.wire import EmbeddingFacts, Embeddings, EngineStats

CANCELLED = "cancelled"


@dataclass
class EmbeddingRequest:
    """One request's inputs and the vectors made so far (little-endian float32 bytes each)."""

    id: int
    sequences: list[list[int]]
    on_done: Callable[[Embeddings], None]
    vectors: list[bytes | None] = field(default_factory=list)
    left: int = 0  # inputs not embedded yet


class Embedder:
    """The embeddings queue of one engine over ``model`` (see the module's docstring). ``work`` is the condition
    the engine's loop waits on (shared with its scheduler), notified when a request arrives or is cancelled."""

    def __init__(self, model: nn.Module, pooling: Pooling, stats: EngineStats, work: threading.Condition, *,
                 max_batch_tokens: int) -> None:
        self.model = model
        self.pooling = pooling
        self.stats = stats
        self.work = work
        self.max_batch_tokens = max_batch_tokens
        self.max_tokens = max_input_tokens(model)
        self.waiting: deque[tuple[EmbeddingRequest, int]] = deque()  # (request, input index), in order
        self.requests: dict[int, EmbeddingRequest] = {}  # id -> a request not answered yet
        self.cancelled: set[int] = set()
        self.admitting = True

    def facts(self) -> EmbeddingFacts:
        dimensions = self.model.config.d_model
        return EmbeddingFacts(self.pooling.mode, self.pooling.normalize, self.pooling.source, dimensions,
                              self.max_tokens)

    # ---- from any thread --------------------------------------------------------------------------

    def submit(self, request_id: int, sequences: Sequence[Sequence[int]],
               on_done: Callable[[Embeddings], None]) -> EmbeddingRequest:
        """Queue ``sequences``; a GenerationError naming the first input that no step could embed (no tokens, too
        long, an id outside the vocabulary)."""
        if not sequences:
            raise GenerationError("no input to embed")
        try:
            for index, ids in enumerate(sequences):
                check_ids(ids, index, self.max_tokens, self.model.config.vocab_size)
        except EmbeddingError as error:
            raise GenerationError(str(error)) from None
        request = EmbeddingRequest(request_id, [list(ids) for ids in sequences], on_done,
                                   [None] * len(sequences), len(sequences))
        with self.work:
            if not self.admitting:
                raise GenerationError("the server is shutting down and admits no new requests")
            self.requests[request_id] = request
            self.waiting.extend((request, index) for index in range(len(sequences)))
            self.work.notify_all()
        return request

    def cancel(self, request_id: int) -> None:
        with self.work:
            if request_id in self.requests:
                self.cancelled.add(request_id)
                self.work.notify_all()

    def cancel_all(self) -> None:
        with self.work:
            self.cancelled.update(self.requests)
            self.work.notify_all()

    def stop_admitting(self) -> None:
        with self.work:
            self.admitting = False

    def has_work(self) -> bool:
        return bool(self.waiting or self.cancelled)

    # ---- inside a step ----------------------------------------------------------------------------

    def step(self) -> int:
        """Answer the cancelled requests, embed one batch of waiting inputs; the inputs embedded."""
        batch = self._take_batch()
        if not batch:
            return 0
        vectors = embed_ids(self.model, [request.sequences[index] for request, index in batch], self.pooling)
        rows = vectors.cpu().numpy().astype("<f4", copy=False)  # (N, D) little-endian float32
        for (request, index), row in zip(batch, rows, strict=True):
            request.vectors[index] = row.tobytes()
            request.left -= 1
            self.stats.embedded_inputs += 1
            self.stats.embedded_tokens += len(request.sequences[index])
            if not request.left:
                self._answer(request, Embeddings(list(request.vectors)))
                self.stats.embedding_requests += 1
        return len(batch)

    def _take_batch(self) -> list[tuple[EmbeddingRequest, int]]:
        """The cancelled requests answered and out of the queue; the next inputs whose padded batch fits."""
        with self.work:
            cancelled, self.cancelled = self.cancelled, set()
            if cancelled:
                self.waiting = deque(item for item in self.waiting if item[0].id not in cancelled)
            gone = [self.requests[request_id] for request_id in cancelled if request_id in self.requests]
            batch: list[tuple[EmbeddingRequest, int]] = []
            longest = 0
            while self.waiting:
                request, index = self.waiting[0]
                length = max(longest, len(request.sequences[index]))
                if batch and (len(batch) + 1) * length > self.max_batch_tokens:
                    break
                batch.append(self.waiting.popleft())
                longest = length
        for request in gone:
            self._answer(request, Embeddings([], CANCELLED))
        return batch

    def _answer(self, request: EmbeddingRequest, answer: Embeddings) -> None:
        with self.work:
            self.requests.pop(request.id, None)
        request.on_done(answer)
