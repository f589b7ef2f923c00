"""The one way a route reaches the engine: a ``Submission`` submits an HTTP request's prompts, hands out the
engine's token events for them (tagged with the choice each belongs to), and cancels them the moment the client's
connection closes; ``stream_response`` sends its chunks as server-sent events, ``check_answered`` guards a whole
answer. Every generating route (completions, chat completions) goes through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import numpy as np
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse

from tformer.generation.settings import GenerationConfig, GenerationError
from tformer.serving.engine_client import EngineBug, EngineFailure
from tformer.serving.inflight import ClientGone, InFlight, cut_by_shutdown, shutting_down
from tformer.serving.openai_api import APIError, as_api_error, sse
from tformer.serving.wire import TokenEvent


class Submission:
    """The engine requests one HTTP request made, the queue their events arrive on (with the prompt each
    answers), and a watch on the client's connection that cancels them the moment it closes (the engine
    stops at its next step)."""

    def __init__(self, flight: InFlight, http_request: HTTPRequest) -> None:
        self.flight = flight
        self.engine = flight.engine
        self.http_request = http_request
        self.queue: asyncio.Queue[tuple[int, TokenEvent]] = asyncio.Queue()  # (prompt index, event)
        self.request_ids: list[int] = []
        self.prompts: list[list[int]] = []  # the HTTP request's prompts' ids, in order
        self.n = 1  # sequences per prompt
        self.unfinished = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cut = False  # a sequence ended with finish reason "cancelled"
        self.client_gone = False
        self._watch: asyncio.Task | None = None

    async def submit(self, prompts: list[list[int]], config: GenerationConfig, n: int, logprobs: int | None,
                     prompt_logprobs: int | None = None, adapter: str | None = None) -> None:
        """Submit every prompt at once (decoded with the LoRA ``adapter``; None: the base model); on any refusal,
        cancel the others and answer the first (in prompt order) before anything has been sent."""
        self._begin()
        self.prompts, self.n = prompts, n
        try:
            outcomes = await self.flight.from_engine(asyncio.gather(
                *(self.engine.submit(prompt, config, n, logprobs, prompt_logprobs, partial(self._receive, index),
                                     adapter)
                  for index, prompt in enumerate(prompts)), return_exceptions=True))
        except APIError:  # the engine failed or stalled before it answered, or the shutdown gave up
            self.close()
            raise
        self.request_ids = [outcome for outcome in outcomes if isinstance(outcome, int)]
        self.unfinished = n * len(self.request_ids)
        self.prompt_tokens = sum(len(prompt) for prompt in prompts)
        refusal = next((outcome for outcome in outcomes if isinstance(outcome, BaseException)), None)
        if refusal is None:
            if self.client_gone:  # it left while the engine answered: the watch had no ids to cancel yet
                self.cancel()
            return
        self.close()
        raise self._answer_to(refusal) from None

    async def transcribe(self, samples: np.ndarray, config: GenerationConfig, language: str | None,
                         logprobs: int | None = None) -> None:
        """Submit a recording's transcription (``EngineClient.transcribe``): a request per window of the audio,
        window ``k``'s events handed out as choice ``k``; a refusal answered as ``submit``'s."""
        self._begin()
        try:
            self.request_ids = await self.flight.from_engine(self.engine.transcribe(
                samples, config, language, logprobs, lambda window: partial(self._receive, window)))
        except APIError:
            self.close()
            raise
        except (GenerationError, EngineFailure, EngineBug) as refusal:
            self.close()
            raise self._answer_to(refusal) from None
        self.unfinished = len(self.request_ids)
        if self.client_gone:  # as submit's
            self.cancel()

    def _begin(self) -> None:
        """In flight from now on (a stop waits for it), its client's connection watched."""
        self.flight.submissions.add(self)
        self._watch = asyncio.create_task(self._watch_connection())

    def _answer_to(self, refusal: BaseException) -> BaseException:
        """The error a refused submit answers with."""
        if isinstance(refusal, EngineFailure):
            return APIError(500, f"the model failed: {refusal}")
        if isinstance(refusal, EngineBug):  # its traceback is in the engine process's log
            return APIError(500, f"internal error: {refusal}")
        if not isinstance(refusal, GenerationError):
            return refusal
        if not self.engine.admitting:
            return shutting_down()
        return as_api_error(refusal)

    def _receive(self, prompt_index: int, event: TokenEvent) -> None:
        self.queue.put_nowait((prompt_index, event))

    async def _watch_connection(self) -> None:
        """Wait for the connection's ``http.disconnect`` (the body is already read, so nothing else arrives
        before it), then cancel."""
        while (await self.http_request.receive())["type"] != "http.disconnect":
            pass
        self.client_gone = True
        self.cancel()

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        """Every event, with the choice it belongs to, until each sequence has finished. A queue timeout is a
        429."""
        while self.unfinished:
            if self.flight.given_up:
                raise cut_by_shutdown()
            try:
                prompt_index, event = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                prompt_index, event = await self.flight.from_engine(self.queue.get())
            if event.token_id >= 0:
                self.completion_tokens += 1
            if event.finish_reason is not None:
                self.unfinished -= 1
                self.cut = self.cut or event.finish_reason == "cancelled"
            if event.finish_reason == "timeout":
                self.cancel()
                raise APIError(429, f"no room in the cache within {self.engine.facts.queue_timeout} s; "
                                    "retry later", code="rate_limit_exceeded")
            yield prompt_index * self.n + event.index, event

    def check_answered(self) -> None:
        """After a whole answer's events: ClientGone when the client left, a 503 when the server cancelled it
        (stopping past its shutdown timeout), so no cut answer goes out as a success."""
        if self.client_gone:
            raise ClientGone
        if self.cut:
            raise cut_by_shutdown()

    def cancel(self) -> None:
        for request_id in self.request_ids:
            self.engine.cancel(request_id)

    def close(self) -> None:
        """The HTTP request is over (answered, failed, or its client gone): stop watching, cancel what runs."""
        if self._watch is not None:
            self._watch.cancel()
        self.cancel()
        self.flight.submissions.discard(self)


async def stream_response(submission: Submission, chunks: AsyncIterator[bytes]) -> Response:
    """A server-sent-event response of ``chunks`` (made from ``submission``'s events), closing the submission when
    it ends. The first chunk is awaited before the headers go out, so a request refused while waiting (a full
    cache past the queue timeout) is still a plain 429."""
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        first = None
    except BaseException:
        submission.close()
        raise
    if submission.client_gone:  # it left while the request waited for its first token
        submission.close()
        raise ClientGone

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                yield first
            async for chunk in chunks:
                yield chunk
            yield sse("[DONE]")
        except APIError as error:
            yield sse(error.body())
            yield sse("[DONE]")
        finally:  # the stream ended, or the client went away: free the blocks
            submission.close()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
