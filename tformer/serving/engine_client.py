"""How the HTTP server reaches the engine: the ``EngineClient`` interface, what crosses it (the engine's
facts and snapshots; its token events and counters are ``wire``'s) and the client whose engine steps on a thread
of the HTTP process.
``engine_process.ProcessEngineClient`` runs the engine in a process of its own instead.

The server never touches an ``Engine``. It submits a prompt and gets the request's id, or the engine's
GenerationError before it has answered anything; it receives the request's ``TokenEvent``s on its event
loop, through the callback it gave with the prompt, one step's events at a time; it cancels by id, reads
snapshots for /metrics, /health and its shutdown line, and stops the engine. Events arrive without their
``request`` (a Request holds the engine's generators, lock and callback): the callback names the request.

Liveness: the engine gives a sign of life at least every HEARTBEAT_SECONDS, idle or not, between two steps (the
engine process sends an update, the engine's thread marks the time), so a step that never returns, or an engine
process that is stopped or hung, goes silent. Past ``stall_timeout`` seconds of silence ``stall`` says so: the
server then answers /health with 503 and fails the requests waiting on the engine instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from tformer.generation.settings import GenerationConfig
from tformer.generation.sources import source_end_id
from tformer.serving.limits import DEFAULT_STALL_SECONDS, HEARTBEAT_SECONDS
from tformer.serving.wire import EmbeddingFacts, Embeddings, EngineStats, TokenEvent

if TYPE_CHECKING:
    from tformer.serving.engine import Engine

# The engine's module (torch, the model's code): loaded wherever an Engine was built, never by this module, which the
# HTTP process imports (see ``EngineFacts.of``).
ENGINE_MODULE = "tformer.serving.engine"

EventSink = Callable[[TokenEvent], None]  # receives one request's events, on the server's event loop
StepEvents = list[tuple[int, TokenEvent]]  # one step's events: (request id, the event without its request)
IDLE_WAIT_SECONDS = 0.1  # how long the engine's thread sleeps on an idle engine before it looks at stopping


@dataclass(frozen=True)
class AudioFacts:
    """What a served speech model reads: recordings at ``sample_rate`` Hz, transcribed in windows of
    ``window_samples`` samples."""

    sample_rate: int
    window_samples: int


@dataclass(frozen=True)
class EngineFacts:
    """What the server reads of the engine once, at start-up: the pool's size, the model's context, how long a
    request may wait for room, where an answer stops by default, and how decode steps read the pool."""

    num_blocks: int
    block_size: int
    position_limit: int | None
    queue_timeout: float | None
    end_token_ids: tuple[int, ...]
    paged_attention: str  # Engine.paged_attention_note
    # the folder's generation_config.json (model.generation_config): what a request leaves out defaults to
    generation_defaults: GenerationConfig | None = None
    generates: bool = True  # False: the model embeds only (an encoder), with no cache (num_blocks 0)
    embedding: EmbeddingFacts | None = None  # how it embeds; None: no embeddings
    embeds_only: str = ""  # Engine.embeds_only: why a generation request is refused when it does not generate
    adapters: tuple[str, ...] = ()  # the LoRA adapters served besides the base (Engine.adapters)
    encodes_prompt: bool = False  # an encoder-decoder: a prompt is the source it translates
    source_end_id: int | None = None  # the token ending an encoder-decoder's source (``sources.source_end_id``)
    audio: AudioFacts | None = None  # a speech model's input: it transcribes recordings (None: it reads text)

    @classmethod
    def of(cls, engine: Engine) -> EngineFacts:
        """The facts of a built ``engine``, read on its side (the engine process, or the HTTP process with the
        engine on a thread), where its module is loaded already: the end ids a request starts from are its."""
        embedding = None if engine.embedder is None else engine.embedder.facts()
        if engine.pool is None:  # embeddings only
            return cls(0, 0, engine.model.position_limit, None, (), engine.paged_attention_note, None, False,
                       embedding, engine.embeds_only)
        module = importlib.import_module(ENGINE_MODULE)
        end_ids = module.serving_defaults(engine.model, None).end_ids(engine.model.config)
        model, tokenizer = engine.model, engine.tokenizer
        end_id = source_end_id(tokenizer, model.config) if model.encodes_prompt and tokenizer is not None else None
        audio = None
        if not model.prompt_is_tokens:
            settings = model.log_mel_settings
            audio = AudioFacts(settings.sample_rate, settings.window_samples)
        return cls(engine.pool.num_blocks, engine.pool.block_size, model.position_limit, engine.queue_timeout,
                   tuple(end_ids), engine.paged_attention_note, module.file_defaults(model), True, embedding,
                   adapters=engine.adapters, encodes_prompt=model.encodes_prompt, source_end_id=end_id, audio=audio)


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's counters and gauges at one moment (between two steps)."""

    stats: EngineStats
    queue_length: int
    running: int
    blocks_in_use: int
    cached_blocks: int  # held by no sequence, kept for the prefix cache
    tokens_stored: int
    has_work: bool

    @classmethod
    def of(cls, engine: Engine) -> EngineSnapshot:
        pool = engine.pool
        return cls(replace(engine.stats), engine.queue_length, engine.running, pool.blocks_in_use if pool else 0,
                   pool.cached_blocks if pool else 0, engine.tokens_stored, engine.has_work())


def detached(event: TokenEvent) -> tuple[int, TokenEvent]:
    """``event`` as it leaves the engine: its request's id, and a copy with every other field as the engine
    set it (``request`` None), so fields added to TokenEvent travel without a change here."""
    return event.request.id, replace(event, request=None)


class EngineFailure(Exception):
    """The engine stopped (its model failed, or its process ended): the message says why."""


class EngineBug(Exception):
    """A submit failed in the engine process on a bug (its traceback is in that process's log); the message is
    the exception's type, as the server's 500 names it."""


@dataclass
class _Route:
    sink: EventSink
    unfinished: int  # sequences without their last event yet


class EngineClient(ABC):
    """The engine as the HTTP server sees it. ``tokenizer`` reads prompts and answers in the HTTP process;
    ``error`` is why the engine stopped (None while it runs); ``admitting`` turns False at ``stop_admitting``;
    ``stall_timeout``: seconds without a sign of life after which ``stall`` reports the engine (None or 0:
    never); ``forced`` turns True when ``stop`` had to end an engine that did not stop in time. Every method
    is called on the server's event loop, after ``start``."""

    def __init__(self, tokenizer, facts: EngineFacts, stall_timeout: float | None = DEFAULT_STALL_SECONDS) -> None:
        self.tokenizer = tokenizer
        self.facts = facts
        self.error: str | None = None
        self.admitting = True
        self.stall_timeout = stall_timeout
        self.forced = False
        self._heard = time.monotonic()  # the engine's last sign of life
        self._routes: dict[int, _Route] = {}  # request id -> where its events go, while it runs

    @abstractmethod
    def start(self) -> None:
        """Begin delivering events to the running event loop."""

    def stall(self) -> str | None:
        """Why the engine counts as stalled (no sign of life for more than ``stall_timeout`` seconds: a step
        that never returns, an engine process stopped or hung), or None. It is a state, not an end: the engine
        counts as running again at its next sign of life."""
        if not self.stall_timeout or self.error is not None:
            return None
        silent = self.silence()
        if silent <= self.stall_timeout:
            return None
        return (f"the engine has made no progress for {silent:.1f} s (more than the {self.stall_timeout:g} s "
                "allowed, --engine-timeout): it is stopped or hung")

    def silence(self) -> float:
        """Seconds since the engine's last sign of life."""
        silent = time.monotonic() - self._heard
        return 0.0 if silent > HEARTBEAT_SECONDS and self._heard_now() else silent

    def unresponsive(self) -> bool:
        """Whether the engine has missed two signs of life (in a long step, or stopped or hung): a stop does not
        wait for it."""
        return self.silence() > 2 * HEARTBEAT_SECONDS

    def _heard_now(self) -> bool:
        """Whether a sign of life waits unread (a client reading its engine's messages looks here)."""
        return False

    @abstractmethod
    async def submit(self, prompt_ids: list[int], config: GenerationConfig, n: int, logprobs: int | None,
                     prompt_logprobs: int | None, sink: EventSink, adapter: str | None = None) -> int:
        """Queue a prompt for ``n`` sequences (``Engine.submit``'s options, ``adapter`` among them); the request's
        id. A GenerationError when the engine refuses it, EngineFailure when the engine has stopped. ``sink`` gets
        each of its events, the last of each sequence with its finish reason."""

    @abstractmethod
    async def transcribe(self, samples: np.ndarray, config: GenerationConfig, language: str | None,
                         logprobs: int | None, sink_for: Callable[[int], EventSink]) -> list[int]:
        """Queue a speech model's transcription of ``samples`` (float32 (N,) at ``facts.audio``'s rate;
        ``Engine.transcribe``'s options): the id of each window's request, in order, window ``k``'s events going to
        ``sink_for(k)``. Refusals and failures as ``submit``'s."""

    @abstractmethod
    async def embed(self, sequences: list[list[int]]) -> Embeddings:
        """The vectors of token-id ``sequences`` (``Engine.embed``), once the engine has embedded them; a
        GenerationError when it refuses them, EngineFailure when it has stopped. Cancelling the wait cancels
        the request."""

    def cancel(self, request_id: int) -> None:
        """Stop a request still running (nothing for one that has finished): its sequences end with finish
        reason ``cancelled`` after at most the step running now."""
        if request_id in self._routes:
            self._cancel(request_id)

    @abstractmethod
    def _cancel(self, request_id: int) -> None: ...

    @abstractmethod
    def cancel_all(self) -> None:
        """Cancel every waiting and running request (the shutdown timeout passed)."""

    @abstractmethod
    def stop_admitting(self) -> None:
        """Refuse new requests from now on (``admitting`` False); those in flight go on."""

    @abstractmethod
    def snapshot(self) -> EngineSnapshot:
        """The engine's counters and gauges (the latest it reported)."""

    @abstractmethod
    async def stop(self, timeout: float = 10.0) -> None:
        """Cancel whatever waits or runs, let the engine free its blocks, end it: within ``timeout`` seconds,
        after which an engine still running is ended without its cooperation (``forced``)."""

    @abstractmethod
    def kill(self) -> None:
        """End the engine at once, from any thread: the process is about to exit without stopping it."""

    def _follow(self, request_id: int, sink: EventSink, n: int) -> None:
        self._routes[request_id] = _Route(sink, n)

    def _route(self, events: StepEvents) -> None:
        """Hand one step's events to their requests' sinks (on the event loop)."""
        for request_id, event in events:
            route = self._routes.get(request_id)
            if route is None:
                continue  # a request whose submitter went away before its id came back (already cancelled)
            if event.finish_reason is not None:
                route.unfinished -= 1
                if not route.unfinished:
                    del self._routes[request_id]
            route.sink(event)


class ThreadEngineClient(EngineClient):
    """The engine stepping on a thread of the HTTP process (``tformer serve --engine thread``, and tests that
    look inside the engine). The two share one interpreter lock: the HTTP side's work after each step and the
    engine's next step take turns."""

    def __init__(self, engine: Engine, stall_timeout: float | None = DEFAULT_STALL_SECONDS) -> None:
        super().__init__(engine.tokenizer, EngineFacts.of(engine), stall_timeout)
        self.engine = engine
        self._outbox: StepEvents = []  # the step's events, filled on the engine's thread
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tformer-engine", daemon=True)

    def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self._heard = time.monotonic()
        self._thread.start()

    async def submit(self, prompt_ids: list[int], config: GenerationConfig, n: int, logprobs: int | None,
                     prompt_logprobs: int | None, sink: EventSink, adapter: str | None = None) -> int:
        if self.error is not None:
            raise EngineFailure(self.error)
        request = self.engine.submit(prompt_ids, config, n=n, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                                     on_event=self._collect, adapter=adapter)
        self._follow(request.id, sink, n)  # before any of its events: they reach the loop after this returns
        return request.id

    async def transcribe(self, samples: np.ndarray, config: GenerationConfig, language: str | None,
                         logprobs: int | None, sink_for: Callable[[int], EventSink]) -> list[int]:
        if self.error is not None:
            raise EngineFailure(self.error)
        requests = self.engine.transcribe(samples, config, language=language, logprobs=logprobs,
                                          on_event=self._collect)
        for window, request in enumerate(requests):
            self._follow(request.id, sink_for(window), 1)
        return [request.id for request in requests]

    async def embed(self, sequences: list[list[int]]) -> Embeddings:
        if self.error is not None:
            raise EngineFailure(self.error)
        event_loop = asyncio.get_running_loop()
        answer: asyncio.Future[Embeddings] = event_loop.create_future()

        def done(embeddings: Embeddings) -> None:  # on the engine's thread
            with contextlib.suppress(RuntimeError):  # the event loop is closed: the server is gone
                event_loop.call_soon_threadsafe(_settle, answer, embeddings)

        request = self.engine.embed(sequences, done)
        try:
            return await answer
        except asyncio.CancelledError:
            self.engine.cancel(request.id)
            raise

    def _cancel(self, request_id: int) -> None:
        self.engine.cancel(request_id)

    def cancel_all(self) -> None:
        self.engine.cancel_all()

    def stop_admitting(self) -> None:
        self.admitting = False
        self.engine.stop_admitting()

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot.of(self.engine)

    async def stop(self, timeout: float = 10.0) -> None:
        await asyncio.to_thread(self._stop, timeout)

    def kill(self) -> None:
        pass  # the engine's thread (a daemon) ends with the process

    def _stop(self, timeout: float) -> None:
        """Within ``timeout``: the cancelled requests' last events (not waited for on an unresponsive engine), then the
        thread's end. A thread stuck in a step is left behind (``forced``): it is a daemon, and ends with the
        process."""
        deadline = time.monotonic() + timeout
        self.stop_admitting()
        self.engine.cancel_all()
        while self.engine.has_work() and self.error is None and not self.unresponsive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, deadline - time.monotonic()))
            self.forced = self._thread.is_alive()

    # ---- on the engine's thread -----------------------------------------------------------------------

    def _collect(self, event: TokenEvent) -> None:
        self._outbox.append(detached(event))

    def _run(self) -> None:
        """Step while there is work, sleep on the engine's condition when not; after each step, the step's
        events to the event loop in one wake-up (not one per token)."""
        engine = self.engine
        while not self._stopping.is_set():
            self._heard = time.monotonic()  # a sign of life at least every IDLE_WAIT_SECONDS, and after each step
            if not engine.wait_for_work(timeout=IDLE_WAIT_SECONDS):
                continue
            try:
                engine.step()
            except Exception as error:  # the model failed: report it, answer 500 from now on
                self.error = str(error) or type(error).__name__
                traceback.print_exc(file=sys.stderr)
                return
            finally:
                self._deliver()

    def _deliver(self) -> None:
        if not self._outbox:
            return
        events, self._outbox = self._outbox, []
        try:
            self._event_loop.call_soon_threadsafe(self._route, events)
        except RuntimeError:  # the event loop is closed: the server is gone
            pass


def _settle(answer: asyncio.Future, value: object) -> None:
    """Give a future waited on by a route its value, unless its waiter is gone (cancelled)."""
    if not answer.done():
        answer.set_result(value)
