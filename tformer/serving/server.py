"""The OpenAI-compatible HTTP server: Starlette routes in front of one ``EngineClient`` (the engine in a
process of its own, or on a thread of this one). Each HTTP request submits its prompts and reads the
engine's token events from an asyncio queue, streamed as server-sent events or gathered into one response.

Lifecycle: SIGTERM (or SIGINT) stops admitting while still listening (new requests, and requests whose
body is still arriving, get 503), lets the requests in flight finish for ``shutdown_timeout`` seconds,
cancels the rest (a whole answer becomes a 503 error object, a stream ends with finish reason
"cancelled" and ``[DONE]``; what the engine has not ended STOP_GRACE_SECONDS later the server ends itself),
then closes the listener, stops the engine (killed if it has not exited within ENGINE_STOP_SECONDS) and
exits 0. A second signal does all of that at once. Whatever hangs, the process exits STOP_MARGIN_SECONDS
past the timeout (past a second signal: SECOND_SIGNAL_SECONDS), with a line saying so and status 1. A
client that goes away, mid-stream or while waiting for a whole answer, has its request cancelled at once:
the engine stops at its next step. A stalled engine (``EngineClient.stall``) fails the requests waiting on
it with 503 and makes /health answer 503, until it shows life again.

Limits: a body past ``max_body_bytes`` is refused (413) before it is read whole, more than ``max_prompts``
prompts (400) before any is tokenized, and more than ``max_request_tokens`` tokens of prompts and answers
(400) as soon as the prompts tokenized so far pass it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tformer.generation.settings import GenerationConfig, GenerationError
from tformer.serving.chat import ChatTemplate, ChatTemplateError
from tformer.serving.engine import TokenEvent
from tformer.serving.engine_client import EngineBug, EngineClient, EngineFailure
from tformer.serving.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPTS
from tformer.serving.openai_api import (
    APIError,
    ChatMessage,
    ChatRequest,
    CompletionLogprobs,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    as_api_error,
    chat_logprob_entry,
    new_id,
    parse_body,
    response_object,
    sse,
    usage,
)
from tformer.tokenizers import TokenizerError

if TYPE_CHECKING:
    import uvicorn

DEFAULT_CHAT_TOKENS = 256  # a chat answer's length when the request sets none and the model has no position limit
CLIENT_CLOSED_REQUEST = 499  # the status counted for a client that left before its answer (never sent)
STOP_GRACE_SECONDS = 1.0  # after the shutdown timeout: time the engine gets to end the requests it cancelled
ENGINE_STOP_SECONDS = 1.0  # after a signal, once the requests are over: time the engine gets to exit before a kill
CLOSE_WAIT_SECONDS = 1.0  # then uvicorn's wait for the last bytes of answers (a client that does not read)
STOP_MARGIN_SECONDS = 5.0  # past the shutdown timeout, the process exits whatever is left
SECOND_SIGNAL_SECONDS = 3.0  # past a second signal, the same
POLL_SECONDS = 0.25  # how often a waiting handler looks for a failed or stalled engine
TEXT_COMPLETION, CHAT_COMPLETION = "text_completion", "chat.completion"  # the response objects' kinds
# With --engine thread, the engine's thread waits for the GIL whenever the HTTP thread holds it; forced
# switches every 0.5 ms instead of Python's 5 bound that wait. Measured at 16 gpt-mini clients, 5, 0.5 and
# 0.1 ms give the same throughput (docs/serving.md): the HTTP thread's work after each step, not the
# interval, is what the engine waits for.
SWITCH_INTERVAL = 0.0005
T = TypeVar("T")


class ClientGone(Exception):
    """The client closed its connection before its answer (mid-body or while it was decoded)."""


class Submission:
    """The engine requests one HTTP request made, the queue their events arrive on (with the prompt each
    answers), and a watch on the client's connection that cancels them the moment it closes (the engine
    stops at its next step)."""

    def __init__(self, server: OpenAIServer, http_request: HTTPRequest) -> None:
        self.server = server
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
                     prompt_logprobs: int | None = None) -> None:
        """Submit every prompt at once; on any refusal, cancel the others and answer the first (in prompt
        order) before anything has been sent."""
        engine = self.server.engine
        self.server.active.add(self)
        self.prompts, self.n = prompts, n
        self._watch = asyncio.create_task(self._watch_connection())
        try:
            outcomes = await self.server.from_engine(asyncio.gather(
                *(engine.submit(prompt, config, n, logprobs, prompt_logprobs, partial(self._receive, index))
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
        if isinstance(refusal, EngineFailure):
            raise APIError(500, f"the model failed: {refusal}") from None
        if isinstance(refusal, EngineBug):  # its traceback is in the engine process's log
            raise APIError(500, f"internal error: {refusal}") from None
        if not isinstance(refusal, GenerationError):
            raise refusal
        if not engine.admitting:
            raise APIError(503, "the server is shutting down", code="shutting_down") from None
        raise as_api_error(refusal) from None

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
            if self.server.given_up:
                raise cut_by_shutdown()
            try:
                prompt_index, event = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                prompt_index, event = await self.server.from_engine(self.queue.get())
            if event.token_id >= 0:
                self.completion_tokens += 1
            if event.finish_reason is not None:
                self.unfinished -= 1
                self.cut = self.cut or event.finish_reason == "cancelled"
            if event.finish_reason == "timeout":
                self.cancel()
                raise APIError(429, f"no room in the cache within {self.server.engine.facts.queue_timeout} s; "
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
            self.server.engine.cancel(request_id)

    def close(self) -> None:
        """The HTTP request is over (answered, failed, or its client gone): stop watching, cancel what runs."""
        if self._watch is not None:
            self._watch.cancel()
        self.cancel()
        self.server.active.discard(self)


def _retrieved(future: asyncio.Future) -> None:
    """Read a finished future's outcome, so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


def cut_by_shutdown() -> APIError:
    """The answer of a request the shutdown timeout cut."""
    return APIError(503, "the server is shutting down: this request was cancelled when the shutdown timeout passed",
                    code="shutting_down")


class OpenAIServer:
    """The routes, over one engine: completions, chat completions, models, the tokenizer (tokenize, detokenize,
    its description), health and metrics."""

    def __init__(self, engine: EngineClient, model_name: str, *, api_key: str | None = None,
                 chat_template: ChatTemplate | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_prompts: int = DEFAULT_MAX_PROMPTS, max_request_tokens: int | None = None) -> None:
        """``max_request_tokens``: prompt and answer tokens of all of a request's sequences together (default:
        the cache's size, what the engine could ever hold at once)."""
        if engine.tokenizer is None:
            raise GenerationError("the server needs the model's tokenizer (text in, text out)")
        self.max_body_bytes = max_body_bytes
        self.max_prompts = max_prompts
        self.max_request_tokens = (max_request_tokens if max_request_tokens is not None
                                   else engine.facts.num_blocks * engine.facts.block_size)
        self.active: set[Submission] = set()  # the submissions whose HTTP requests are not over
        self._reading: set[asyncio.Task] = set()  # the handlers still reading a body
        self._refused: set[asyncio.Task] = set()  # those of them begin_stop cancelled, to answer 503
        self.stop_deadline: float | None = None  # set by begin_stop: when requests in flight are cancelled
        self._cancelled_in_flight = False
        self.given_up_at: float | None = None  # when the server began to end the cancelled requests itself
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.api_key = api_key
        self.chat_template = chat_template
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self.responses: Counter[int] = Counter()  # HTTP status -> count, for /metrics
        self.created = int(time.time())

    def app(self) -> Callable[[dict, Callable, Callable], Awaitable[None]]:
        """The ASGI app: the routes. A handler that uvicorn cancels once a stop has waited CLOSE_WAIT_SECONDS for
        it (its client reads nothing) ends quietly: a stop logs no traceback."""
        starlette = self._starlette()

        async def app(scope: dict, receive: Callable, send: Callable) -> None:
            try:
                await starlette(scope, receive, send)
            except asyncio.CancelledError:
                if self.stop_deadline is None:
                    raise

        return app

    def _starlette(self) -> Starlette:
        routes = [
            Route("/v1/completions", self._endpoint(self.completions), methods=["POST"]),
            Route("/v1/chat/completions", self._endpoint(self.chat_completions), methods=["POST"]),
            Route("/v1/models", self._endpoint(self.models), methods=["GET"]),
            Route("/tokenize", self._endpoint(self.tokenize), methods=["POST"]),
            Route("/detokenize", self._endpoint(self.detokenize), methods=["POST"]),
            Route("/tokenizer_info", self._endpoint(self.tokenizer_info), methods=["GET"]),
            Route("/health", self._endpoint(self.health, open_=True), methods=["GET"]),
            Route("/metrics", self._endpoint(self.metrics), methods=["GET"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_exception},
                         lifespan=self._lifespan)

    # ---- plumbing -----------------------------------------------------------------------------------

    def _endpoint(self, handler: Callable[[HTTPRequest], Awaitable[Response]], open_: bool = False):
        """``handler`` behind the API-key check, its APIErrors answered as OpenAI error objects."""
        async def endpoint(http_request: HTTPRequest) -> Response:
            try:
                if not open_:
                    self._check_key(http_request)
                response = await handler(http_request)
            except APIError as error:
                headers = {"Connection": "close"} if error.status in (413, 503) else None  # a body may be unread
                response = JSONResponse(error.body(), status_code=error.status, headers=headers)
            except ClientGone:  # nobody to answer; counted, never sent
                response = Response(status_code=CLIENT_CLOSED_REQUEST)
            except Exception as error:  # a bug: its traceback for the operator, an error object for the client
                traceback.print_exc(file=sys.stderr)
                response = JSONResponse(APIError(500, f"internal error: {type(error).__name__}").body(),
                                        status_code=500)
            self.responses[response.status_code] += 1
            return response

        return endpoint

    async def _http_exception(self, http_request: HTTPRequest, error: HTTPException) -> Response:
        """Unknown paths and methods answered in the same error format."""
        self.responses[error.status_code] += 1
        message = f"{http_request.method} {http_request.url.path}: {error.detail}"
        return JSONResponse(APIError(error.status_code, message).body(), status_code=error.status_code)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """The engine runs while the app does; stopping it cancels what is left."""
        self._event_loop = asyncio.get_running_loop()
        self.engine.start()
        try:
            yield
        finally:
            if self.stop_deadline is None:
                await self.engine.stop()
            else:  # a signal's stop: the requests are over, the engine has nothing left to finish
                await self.engine.stop(ENGINE_STOP_SECONDS)

    async def _read_body(self, http_request: HTTPRequest) -> bytes:
        """The body, refused with 413 as soon as it passes ``max_body_bytes`` (by its Content-Length before a
        byte is read); ClientGone when the client leaves mid-body; a 503 when the server starts stopping."""
        limit = self.max_body_bytes
        declared = http_request.headers.get("content-length", "")
        too_large = APIError(413, f"the request body is larger than {limit:,} bytes (the server's --max-body-bytes)",
                             code="request_too_large")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        task = asyncio.current_task()
        self._reading.add(task)
        chunks, size = [], 0
        try:
            async for chunk in http_request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
        except ClientDisconnect:
            raise ClientGone from None
        except asyncio.CancelledError:
            if task not in self._refused:
                raise
            task.uncancel()  # begin_stop's cancel: answer instead of waiting for the rest
            raise APIError(503, "the server is shutting down", code="shutting_down") from None
        finally:
            self._reading.discard(task)
            self._refused.discard(task)
        return b"".join(chunks)

    def begin_stop(self, timeout: float) -> None:
        """Stop admitting (new requests get 503) and refuse the bodies still arriving; the requests in flight
        get ``timeout`` seconds (see ``drained``). Callable from any thread, and from a signal handler: the work
        is done on the event loop, whose thread the handler may have interrupted holding the engine's lock."""
        if self.stop_deadline is not None:
            return
        self.stop_deadline = time.monotonic() + timeout
        if self._event_loop is None:
            self.engine.stop_admitting()
        else:
            self._event_loop.call_soon_threadsafe(self._stop_admitting)

    def _stop_admitting(self) -> None:
        self.engine.stop_admitting()
        for task in self._reading - self._refused:
            self._refused.add(task)
            task.cancel()

    def stop_now(self) -> None:
        """A second signal: what ``begin_stop`` gives the requests in flight is over now (they are cancelled, and
        ended by the server at once: see ``drained``). Callable from a signal handler, as ``begin_stop``."""
        self.begin_stop(0.0)
        self.stop_deadline = min(self.stop_deadline, time.monotonic() - STOP_GRACE_SECONDS)

    @property
    def given_up(self) -> bool:
        return self.given_up_at is not None

    def drained(self) -> bool:
        """After ``begin_stop``, on the event loop: whether the requests in flight are over. Past the deadline
        they are cancelled; those the engine has not ended STOP_GRACE_SECONDS later (at once when it is
        unresponsive) the server ends itself (``given_up``), each at its next look, within POLL_SECONDS."""
        if not self.active and not self._reading:
            return True
        now = time.monotonic()
        if now < self.stop_deadline:
            return False
        if not self._cancelled_in_flight:
            self._cancelled_in_flight = True
            self.engine.cancel_all()
        if self.given_up_at is None and (now >= self.stop_deadline + STOP_GRACE_SECONDS or self.engine.unresponsive()):
            self.given_up_at = now
        return self.given_up and now >= self.given_up_at + 2 * POLL_SECONDS

    async def from_engine(self, awaitable: Awaitable[T]) -> T:
        """What ``awaitable`` gives (the engine's answer, a request's next event), looking every POLL_SECONDS
        for why it may never come (``check_in_flight``): then that APIError, ``awaitable`` cancelled."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=POLL_SECONDS)
                if done:
                    return task.result()
                self.check_in_flight()
        finally:
            if not task.done():
                task.cancel()
                task.add_done_callback(_retrieved)  # a gather cancelled ends with its CancelledError as a result

    def check_in_flight(self) -> None:
        """An APIError when the requests in flight will get nothing more from the engine: the shutdown has given
        up on them (503), the engine failed (500) or it stalled (503)."""
        if self.given_up:
            raise cut_by_shutdown()
        if self.engine.error is not None:
            raise APIError(500, f"the model failed: {self.engine.error}")
        stall = self.engine.stall()
        if stall is not None:
            raise APIError(503, stall, code="engine_stalled")

    def _check_key(self, http_request: HTTPRequest) -> None:
        if self.api_key is None:
            return
        given = http_request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise APIError(401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key")

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"model {name!r} does not exist; this server serves {self.model_name!r}",
                           "model", "model_not_found")

    def _check_admitting(self) -> None:
        if not self.engine.admitting:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        self.check_in_flight()

    def _prompt_ids(self, prompts: list[str | list[int]], n: int) -> list[list[int]]:
        """Each prompt's ids; a 400 past ``max_prompts`` before any is tokenized, and as soon as the prompts so
        far pass ``max_request_tokens``."""
        if len(prompts) > self.max_prompts:
            raise APIError(400, f"{len(prompts):,} prompts in one request; at most {self.max_prompts} "
                                "(the server's --max-prompts)", "prompt")
        every: list[list[int]] = []
        for index, prompt in enumerate(prompts):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            if not ids:
                raise APIError(400, f"prompt {index} has no tokens", "prompt")
            every.append(ids)
            self._check_request_tokens(every, n, 0)
        return every

    def _check_request_tokens(self, prompts: list[list[int]], n: int, new_tokens: int) -> None:
        """A 400 when ``n`` sequences of each prompt, prompt and ``new_tokens`` together, pass
        ``max_request_tokens``."""
        total = n * sum(len(prompt) + new_tokens for prompt in prompts)
        if total > self.max_request_tokens:
            raise APIError(400, f"the request needs {'more than ' if not new_tokens else ''}{total:,} tokens (n={n} x "
                                f"{len(prompts)} prompt(s) x (prompt + max_tokens)); at most "
                                f"{self.max_request_tokens:,} per request (the server's --max-request-tokens)",
                           "max_tokens" if new_tokens else "prompt", "request_too_large")

    def _default_tokens(self, prompt_length: int) -> int:
        """Room left in the context after the prompt (a request that set no limit)."""
        limit = self.engine.facts.position_limit
        return DEFAULT_CHAT_TOKENS if limit is None else max(1, limit - prompt_length)

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _top(self, event: TokenEvent) -> list[tuple[str, float]]:
        return self._top_texts(event.top_logprobs or [])

    def _top_texts(self, top: list[tuple[int, float]]) -> list[tuple[str, float]]:
        return [(self._token_text(token), value) for token, value in top]

    async def _chat_text(self, messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
        """``messages`` rendered by the chat template, on a worker thread (a slow template, bounded by its time
        limit, holds no other request); a 400 without a template or when it fails."""
        if self.chat_template is None:
            raise APIError(400, f"model {self.model_name!r} has no chat template (the checkpoint's tokenizer ships "
                                "none; start the server with --chat-template FILE, or use /v1/completions)",
                           "messages", "no_chat_template")
        rendered = [message.as_template_input() for message in messages]
        try:
            return await asyncio.to_thread(self.chat_template.render, rendered, add_generation_prompt)
        except ChatTemplateError as error:
            raise APIError(400, str(error), "messages") from None

    # ---- routes -------------------------------------------------------------------------------------

    async def health(self, http_request: HTTPRequest) -> Response:
        if self.engine.error is not None:
            return JSONResponse({"status": "failed", "error": self.engine.error}, status_code=500)
        stall = self.engine.stall()
        if stall is not None:
            return JSONResponse({"status": "stalled", "error": stall}, status_code=503)
        if not self.engine.admitting:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def models(self, http_request: HTTPRequest) -> Response:
        model = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "tformer",
                 "max_model_len": self.engine.facts.position_limit}
        return JSONResponse({"object": "list", "data": [model]})

    async def metrics(self, http_request: HTTPRequest) -> Response:
        return PlainTextResponse(self.metrics_text(), media_type="text/plain; version=0.0.4")

    async def tokenize(self, http_request: HTTPRequest) -> Response:
        """The ids a completion or chat completion would prefill for the same prompt or messages."""
        body: TokenizeRequest = parse_body(await self._read_body(http_request), TokenizeRequest)
        if body.model is not None:
            self._check_model(body.model)
        if body.messages is not None:
            text = await self._chat_text(body.messages, body.add_generation_prompt is not False)
        else:
            text = body.prompt
        tokens = self.tokenizer.encode(text, add_special_tokens=body.special_tokens)
        return JSONResponse({"count": len(tokens), "max_model_len": self.engine.facts.position_limit,
                             "tokens": tokens})

    async def detokenize(self, http_request: HTTPRequest) -> Response:
        body: DetokenizeRequest = parse_body(await self._read_body(http_request), DetokenizeRequest)
        if body.model is not None:
            self._check_model(body.model)
        try:
            text = self.tokenizer.decode(body.tokens)
        except TokenizerError as error:  # an id outside the vocabulary
            raise APIError(400, str(error), "tokens") from None
        return JSONResponse({"prompt": text})

    async def tokenizer_info(self, http_request: HTTPRequest) -> Response:
        """What a client needs to tokenize as the server does (the fields vLLM's route returns that apply)."""
        tokenizer, facts = self.tokenizer, self.engine.facts
        return JSONResponse({
            "tokenizer_class": type(tokenizer).__name__, "kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
            **{f"{role}_token": tokenizer.special_token(role) for role in ("bos", "eos", "pad", "unk")},
            "special_tokens": tokenizer.special_tokens,
            "end_token_ids": list(facts.end_token_ids),  # where an answer stops by default
            "chat_template": None if self.chat_template is None else self.chat_template.source,
            "max_model_len": facts.position_limit,
        })

    async def completions(self, http_request: HTTPRequest) -> Response:
        body: CompletionRequest = parse_body(await self._read_body(http_request), CompletionRequest)
        self._check_model(body.model)
        self._check_admitting()
        texts = body.prompts()
        prompts = self._prompt_ids(texts, body.n)
        tokens = body.token_limit
        self._check_request_tokens(prompts, body.n, tokens)
        echoes = self._echoes(texts, prompts) if body.echo else None
        submission = Submission(self, http_request)
        await submission.submit(prompts, body.generation_config(tokens), body.n, body.logprobs, body.prompt_logprobs)
        response_id = new_id("cmpl")
        with_logprobs = body.logprobs is not None
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return await self._stream(submission, self._completion_chunks(submission, response_id, echoes,
                                                                          with_logprobs, include_usage))
        try:
            return await self._whole_completion(submission, response_id, echoes, with_logprobs)
        finally:
            submission.close()

    def _echoes(self, texts: list[str | list[int]], prompts: list[list[int]]) -> list[str]:
        """What ``echo`` repeats of each prompt: its text as sent, or the text of its ids (a 400 for an id the
        tokenizer has no text for)."""
        echoes = []
        for index, (text, ids) in enumerate(zip(texts, prompts, strict=True)):
            try:
                echoes.append(text if isinstance(text, str) else self.tokenizer.decode(ids))
            except TokenizerError as error:
                raise APIError(400, f"prompt {index}: {error}", "prompt") from None
        return echoes

    def _completion_piece(self, submission: Submission, index: int, event: TokenEvent,
                          records: dict[int, CompletionLogprobs], echoes: list[str] | None) -> tuple[str, int]:
        """Record ``event`` in its choice's logprobs; its text, and where its entries start in the record. A
        choice's first event starts with its prompt when ``echoes`` (each prompt's text) are given, and with the
        prompt's tokens and their log-probabilities when the event carries them. ``index``: its choice."""
        first = index not in records
        record = records.setdefault(index, CompletionLogprobs(self.tokenizer))
        start, text = len(record.tokens), event.text
        if first and echoes is not None:
            prompt, ids = index // submission.n, submission.prompts[index // submission.n]
            text = echoes[prompt] + text
            scores = event.prompt_logprobs
            if scores is None:
                record.start_answer(len(echoes[prompt]))
            else:
                record.add_prompt(echoes[prompt], ids, [self._token_text(token) for token in ids],
                                  scores.token_logprobs, [self._top_texts(top) for top in scores.top_logprobs])
        if event.token_id >= 0 and event.logprob is not None:
            record.add(event.token_id, self._token_text(event.token_id), event.logprob, self._top(event))
        return text, start

    async def _whole_completion(self, submission: Submission, response_id: str, echoes: list[str] | None,
                                with_logprobs: bool) -> Response:
        choices: dict[int, dict[str, Any]] = {}
        records: dict[int, CompletionLogprobs] = {}
        async for index, event in submission.events():
            choice = choices.setdefault(index, {"text": "", "finish_reason": None})
            choice["text"] += self._completion_piece(submission, index, event, records, echoes)[0]
            if event.finish_reason is not None:
                choice["finish_reason"] = event.finish_reason
        listed = [{"index": index, "text": choices[index]["text"],
                   "logprobs": records[index].since(0, len(choices[index]["text"])) if with_logprobs else None,
                   "finish_reason": choices[index]["finish_reason"]} for index in sorted(choices)]
        submission.check_answered()
        counts = usage(submission.prompt_tokens, submission.completion_tokens)
        return JSONResponse(response_object(TEXT_COMPLETION, response_id, self.model_name, listed, counts))

    async def _completion_chunks(self, submission: Submission, response_id: str, echoes: list[str] | None,
                                 with_logprobs: bool, include_usage: bool) -> AsyncIterator[bytes]:
        records: dict[int, CompletionLogprobs] = {}
        async for index, event in submission.events():
            text, start = self._completion_piece(submission, index, event, records, echoes)
            added = with_logprobs and len(records[index].tokens) > start
            choice = {"index": index, "text": text, "logprobs": records[index].since(start) if added else None,
                      "finish_reason": event.finish_reason}
            yield sse(response_object(TEXT_COMPLETION, response_id, self.model_name, [choice], None, chunk=True))
        if include_usage:
            counts = usage(submission.prompt_tokens, submission.completion_tokens)
            yield sse(response_object(TEXT_COMPLETION, response_id, self.model_name, [], counts, chunk=True))

    async def chat_completions(self, http_request: HTTPRequest) -> Response:
        body: ChatRequest = parse_body(await self._read_body(http_request), ChatRequest)
        self._check_model(body.model)
        self._check_admitting()
        text = await self._chat_text(body.messages)
        prompt = self.tokenizer.encode(text, add_special_tokens=False)
        if not prompt:
            raise APIError(400, "the messages render to no tokens", "messages")
        tokens = body.token_limit if body.token_limit is not None else self._default_tokens(len(prompt))
        self._check_request_tokens([prompt], body.n, tokens)
        top = (body.top_logprobs or 0) if body.logprobs else None
        submission = Submission(self, http_request)
        await submission.submit([prompt], body.generation_config(tokens), body.n, top)
        response_id = new_id("chatcmpl")
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return await self._stream(submission, self._chat_chunks(submission, response_id, include_usage))
        try:
            return await self._whole_chat(submission, response_id, body.logprobs)
        finally:
            submission.close()

    async def _whole_chat(self, submission: Submission, response_id: str, with_logprobs: bool) -> Response:
        choices: dict[int, dict[str, Any]] = {}
        async for index, event in submission.events():
            choice = choices.setdefault(index, {"content": "", "logprobs": [] if with_logprobs else None,
                                                "finish_reason": None})
            choice["content"] += event.text
            if event.token_id >= 0 and event.logprob is not None:
                choice["logprobs"].append(chat_logprob_entry(self._token_text(event.token_id), event.logprob,
                                                             self._top(event)))
            if event.finish_reason is not None:
                choice["finish_reason"] = event.finish_reason
        listed = [{"index": index, "message": {"role": "assistant", "content": choice["content"]},
                   "logprobs": None if choice["logprobs"] is None else {"content": choice["logprobs"]},
                   "finish_reason": choice["finish_reason"]} for index, choice in sorted(choices.items())]
        submission.check_answered()
        counts = usage(submission.prompt_tokens, submission.completion_tokens)
        return JSONResponse(response_object(CHAT_COMPLETION, response_id, self.model_name, listed, counts))

    async def _chat_chunks(self, submission: Submission, response_id: str,
                           include_usage: bool) -> AsyncIterator[bytes]:
        opened: set[int] = set()
        async for index, event in submission.events():
            delta: dict[str, Any] = {} if event.token_id < 0 else {"content": event.text}
            if index not in opened:
                opened.add(index)
                delta = {"role": "assistant", **delta}
            logprobs = None
            if event.token_id >= 0 and event.logprob is not None:
                logprobs = {"content": [chat_logprob_entry(self._token_text(event.token_id), event.logprob,
                                                           self._top(event))]}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": event.finish_reason}
            yield sse(response_object(CHAT_COMPLETION, response_id, self.model_name, [choice], None, chunk=True))
        if include_usage:
            counts = usage(submission.prompt_tokens, submission.completion_tokens)
            yield sse(response_object(CHAT_COMPLETION, response_id, self.model_name, [], counts, chunk=True))

    async def _stream(self, submission: Submission, chunks: AsyncIterator[bytes]) -> Response:
        """A server-sent-event response. The first chunk is awaited before the headers go out, so a
        request refused while waiting (a full cache past the queue timeout) is still a plain 429."""
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

    # ---- metrics --------------------------------------------------------------------------------------

    def metrics_text(self) -> str:
        """Prometheus' text format: counters and gauges of the engine and the HTTP side."""
        snapshot, facts = self.engine.snapshot(), self.engine.facts
        stats = snapshot.stats
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP tformer_{name} {help_text}", f"# TYPE tformer_{name} {kind}"])
            lines.extend(f"tformer_{name}{labels} {value}" for labels, value in samples)

        metric("requests_total", "counter", "Engine requests by outcome.",
               [('{outcome="submitted"}', stats.requests_submitted), ('{outcome="finished"}', stats.requests_finished),
                ('{outcome="cancelled"}', stats.requests_cancelled), ('{outcome="timeout"}', stats.requests_timed_out)])
        metric("http_responses_total", "counter", "HTTP responses by status code.",
               [(f'{{code="{code}"}}', count) for code, count in sorted(self.responses.items())])
        metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", [("", stats.prompt_tokens)])
        metric("prompt_tokens_computed_total", "counter", "Prompt tokens the model ran (every sequence's).",
               [("", stats.prompt_tokens_computed)])
        metric("prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
               [("", stats.prefix_cache_hit_tokens)])
        metric("prefix_cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache / prompt tokens.",
               [("", stats.prefix_cache_hit_rate)])
        metric("generated_tokens_total", "counter", "Tokens generated.", [("", stats.generated_tokens)])
        metric("engine_steps_total", "counter", "Engine steps (one forward each).", [("", stats.steps)])
        metric("queue_length", "gauge", "Requests waiting for room.", [("", snapshot.queue_length)])
        metric("running_sequences", "gauge", "Sequences decoding.", [("", snapshot.running)])
        metric("cache_blocks_in_use", "gauge", "Key/value cache blocks allocated.", [("", snapshot.blocks_in_use)])
        metric("cache_blocks_total", "gauge", "Key/value cache blocks in the pool.", [("", facts.num_blocks)])
        metric("cache_block_size", "gauge", "Tokens per cache block.", [("", facts.block_size)])
        metric("cache_blocks_cached", "gauge", "Blocks no sequence holds, kept for the prefix cache until evicted.",
               [("", snapshot.cached_blocks)])
        metric("cache_tokens_stored", "gauge", "Tokens whose keys and values the cache holds.",
               [("", snapshot.tokens_stored)])
        return "\n".join(lines) + "\n"


def run(server: OpenAIServer, host: str = "127.0.0.1", port: int = 8000, shutdown_timeout: float = 30.0,
        log_level: str = "warning") -> None:
    """Serve until SIGTERM or SIGINT, then drain (see the module's docstring) and return."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    backstop = Backstop(server.engine)
    try:
        uvicorn_server(server, host, port, shutdown_timeout, log_level, backstop).run()
    finally:
        backstop.disarm()
    snapshot = server.engine.snapshot()
    stats = snapshot.stats
    if server.engine.error is not None:  # its gauges are stale: what ran then failed with it
        state = f"the engine had stopped before ({server.engine.error}): these are its figures up to then"
    else:
        state = f"{snapshot.blocks_in_use} cache blocks in use"
        if server.engine.forced:
            state += "; the engine did not stop in time and was ended: these are its last figures"
    print(f"tformer serve: stopped: {stats.requests_finished} request(s) finished, {stats.requests_cancelled} "
          f"cancelled, {stats.requests_timed_out} timed out; {state}", file=sys.stderr, flush=True)


class Backstop:
    """The bound on a stop, whatever hangs: armed at each signal, it ends the process when the time is up (a line
    saying why, the engine killed, exit status 1) unless disarmed first, when the stop is done."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float, why: str) -> None:
        """End the process in ``seconds`` (replacing an earlier arming), saying ``why``."""
        self.disarm()
        self._timer = threading.Timer(seconds, self._exit, (why,))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _exit(self, why: str) -> None:
        print(f"tformer serve: {why}; exiting now", file=sys.stderr, flush=True)
        self.engine.kill()
        os._exit(1)


def uvicorn_server(server: OpenAIServer, host: str, port: int, shutdown_timeout: float, log_level: str,
                   backstop: Backstop | None = None) -> uvicorn.Server:
    """A uvicorn server for ``server`` whose first SIGTERM or SIGINT drains while still listening (new requests
    get 503: ``OpenAIServer.begin_stop``) and closes the listener once ``drained``; a second one ends the
    requests in flight at once (``OpenAIServer.stop_now``). Each signal arms ``backstop``."""
    import uvicorn

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            if server.stop_deadline is None:
                error = server.engine.error  # an engine that stopped (killed, its model failed) runs nothing
                running = server.engine.snapshot().running
                in_flight = (f"none in flight: the engine had stopped ({error})" if error is not None else
                             f"{running} sequence(s) in flight get up to {shutdown_timeout:g} s")
                print(f"tformer serve: stopping: no new requests; {in_flight}", file=sys.stderr, flush=True)
                server.begin_stop(shutdown_timeout)
                if backstop is not None:
                    backstop.arm(shutdown_timeout + STOP_MARGIN_SECONDS, f"the stop took over --shutdown-timeout "
                                 f"{shutdown_timeout:g} s + {STOP_MARGIN_SECONDS:g} s")
            else:
                print("tformer serve: a second signal: ending the requests in flight now", file=sys.stderr,
                      flush=True)
                server.stop_now()
                if backstop is not None:
                    backstop.arm(SECOND_SIGNAL_SECONDS, f"the stop took over {SECOND_SIGNAL_SECONDS:g} s after a "
                                 "second signal")

        async def on_tick(self, counter: int) -> bool:
            if server.stop_deadline is not None and not self.should_exit and server.drained():
                self.should_exit = True
            return await super().on_tick(counter)

        def capture_signals(self):  # uvicorn re-raises the signal after shutdown; a drained stop exits 0
            return _signals_to(self.handle_exit)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                bound_host, bound_port = self.servers[0].sockets[0].getsockname()[:2]
                print(f"tformer serve: listening on http://{bound_host}:{bound_port} (model {server.model_name!r}; "
                      f"{server.engine.facts.paged_attention})", file=sys.stderr, flush=True)

    # The drain happens before uvicorn's own shutdown, which then only waits for the last bytes to go out.
    config = uvicorn.Config(server.app(), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=CLOSE_WAIT_SECONDS, lifespan="on")
    return Uvicorn(config)


class _signals_to:
    """Route SIGINT and SIGTERM to ``handler`` while inside; restore the old handlers after."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, handler) -> None:
        self.handler = handler
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self.handler) for sig in self.SIGNALS}

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
