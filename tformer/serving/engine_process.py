"""The engine in a process of its own (``tformer serve --engine process``, the default), so the HTTP side's
work (parsing, tokenizing, formatting server-sent events) and the engine's steps run on two cores instead
of taking turns under one interpreter lock.

The engine process, started with multiprocessing's "spawn", builds the engine itself (``build`` loads the
model from its checkpoint: a model never crosses the pipe) and loops: read the commands waiting on its
pipe, step while there is work, and after each step send one ``Update`` holding every event of the step, the
answers to the submits read before it and a snapshot of the engine's counters. Commands are small messages the
other way (but a recording to transcribe): ``Submit``, ``Transcribe``, ``Embed``, ``Cancel``, ``CancelAll``,
``StopAdmitting``, ``Close``. An update goes out at least every HEARTBEAT_SECONDS, with nothing new in it if
need be: the HTTP process's sign of life (``EngineClient.stall``).

The HTTP process owns shutdown: the engine process ignores SIGINT and SIGTERM, drains and exits at
``Close``, and exits when its pipe ends (the HTTP process died), so it never outlives the server. A model
that fails in a step has its traceback printed and its message sent as the update's ``error``; the engine
process then exits, and the HTTP process answers 500, as it does when the engine process dies. ``stop`` is
bounded: an engine process that has not exited by its timeout (stopped, hung, in a long step) is killed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import numpy as np

from tformer.errors import TformerError
from tformer.generation.settings import GenerationConfig, GenerationError
from tformer.serving.engine_client import (
    EngineBug,
    EngineClient,
    EngineFacts,
    EngineFailure,
    EngineSnapshot,
    EventSink,
    StepEvents,
    detached,
)
from tformer.serving.limits import DEFAULT_STALL_SECONDS, HEARTBEAT_SECONDS
from tformer.serving.wire import Embeddings, TokenEvent

if TYPE_CHECKING:
    from tformer.serving.engine import Engine  # built in the engine process by ``build``; never imported here

BLOCKED_WAIT_SECONDS = 0.01  # requests wait for room with nothing running: how often the engine looks again
CLOSE_SECONDS = 5.0  # after its pipe is closed outside ``stop``: time the engine process gets to exit before a kill


SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # the HTTP process's to handle; the engine process ignores them


# ---- the messages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    ticket: int  # pairs the engine's answer with this submit
    prompt_ids: list[int]
    config: GenerationConfig
    n: int
    logprobs: int | None
    prompt_logprobs: int | None
    adapter: str | None = None  # the served LoRA adapter (None: the base model)


@dataclass(frozen=True)
class Transcribe:
    ticket: int  # pairs the engine's answer (each window's request id) with this request
    samples: np.ndarray  # float32 (N,) at the model's rate
    config: GenerationConfig
    language: str | None
    logprobs: int | None


@dataclass(frozen=True)
class Embed:
    ticket: int  # pairs the engine's answers (the request's id, then its vectors) with this request
    sequences: list[list[int]]


@dataclass(frozen=True)
class Cancel:
    request_id: int


@dataclass(frozen=True)
class CancelAll:
    pass


@dataclass(frozen=True)
class StopAdmitting:
    pass


@dataclass(frozen=True)
class Close:
    """Cancel what is left, send the last update, exit."""


@dataclass(frozen=True)
class Started:
    facts: EngineFacts
    snapshot: EngineSnapshot


@dataclass(frozen=True)
class StartFailed:
    message: str


@dataclass(frozen=True)
class SubmitFailed:
    """A submit that raised something other than the engine's refusal: a bug, named by its type."""

    error_type: str


@dataclass
class Update:
    """What changed since the last update: one step's events, the submits answered, the counters after."""

    snapshot: EngineSnapshot
    events: StepEvents = field(default_factory=list)
    # ticket -> the request's id (a transcription's: each window's), or why not
    answers: dict[int, int | list[int] | str | SubmitFailed] = field(default_factory=dict)
    embeddings: dict[int, Embeddings] = field(default_factory=dict)  # ticket -> an embeddings request's answer
    error: str | None = None  # the model failed: the engine process ends after this update


class EngineStartError(TformerError):
    """The engine could not be built in its process; the message is the error it raised there."""


# ---- the engine process ------------------------------------------------------------------------------


def run_engine_process(connection: Connection, build: Callable[[], Engine]) -> None:
    """The engine process's body: build the engine, say so (or why not), serve commands until ``Close`` or
    the end of the pipe."""
    for sig in SHUTDOWN_SIGNALS:  # the HTTP process owns shutdown
        signal.signal(sig, signal.SIG_IGN)
    try:
        try:
            engine = build()
        except (TformerError, OSError) as error:
            connection.send(StartFailed(str(error)))
            return
        connection.send(Started(EngineFacts.of(engine), EngineSnapshot.of(engine)))
        _EngineHost(engine, connection).run()
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the HTTP process is gone
        pass
    # The engine's state ends with it: no interpreter teardown (most of a second with torch loaded), which a
    # stopping server would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _EngineHost:
    """The engine process's loop: commands in, steps, one update out after each step."""

    def __init__(self, engine: Engine, connection: Connection) -> None:
        self.engine = engine
        self.connection = connection
        self.update = Update(EngineSnapshot.of(engine))  # what the next report sends
        self.reported = self.update.snapshot
        self.sent_at = time.monotonic()

    def run(self) -> None:
        engine = self.engine
        made = None  # tokens the last step made (0: it could run nothing)
        while True:
            wait = HEARTBEAT_SECONDS if not engine.has_work() else BLOCKED_WAIT_SECONDS if made == 0 else 0.0
            if self.connection.poll(wait) and not self.read_commands():
                self.close()
                return
            if self.update.answers:  # before the step: a submitter waits for its answer
                self.report()
            made = None
            if engine.has_work():
                try:
                    made = engine.step()
                except Exception as error:  # the model failed: say so, then end
                    traceback.print_exc(file=sys.stderr)
                    self.update.error = str(error) or type(error).__name__
                    self.report()
                    return
            self.report()

    def read_commands(self) -> bool:
        """Apply every command waiting on the pipe; False at ``Close``."""
        while True:
            command = self.connection.recv()
            match command:
                case Submit():
                    self.submit(command)
                case Transcribe():
                    self.transcribe(command)
                case Embed():
                    self.embed(command)
                case Cancel(request_id=request_id):
                    self.engine.cancel(request_id)
                case CancelAll():
                    self.engine.cancel_all()
                case StopAdmitting():
                    self.engine.stop_admitting()
                case Close():
                    return False
                case _:
                    raise TypeError(f"unknown command {command!r}")
            if not self.connection.poll():
                return True

    def submit(self, command: Submit) -> None:
        self.answer(command.ticket, lambda: self.engine.submit(
            command.prompt_ids, command.config, n=command.n, logprobs=command.logprobs,
            prompt_logprobs=command.prompt_logprobs, on_event=self.collect, adapter=command.adapter).id)

    def transcribe(self, command: Transcribe) -> None:
        self.answer(command.ticket, lambda: [request.id for request in self.engine.transcribe(
            command.samples, command.config, language=command.language, logprobs=command.logprobs,
            on_event=self.collect)])

    def answer(self, ticket: int, queue: Callable[[], int | list[int]]) -> None:
        """Answer ``ticket`` with what ``queue`` returns (the ids of the requests it queued), or with why not: the
        engine's refusal, or a bug's type (its traceback here, a 500 for this request; the engine goes on)."""
        try:
            self.update.answers[ticket] = queue()
        except GenerationError as error:
            self.update.answers[ticket] = str(error)
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            self.update.answers[ticket] = SubmitFailed(type(error).__name__)

    def embed(self, command: Embed) -> None:
        def done(embeddings: Embeddings) -> None:
            self.update.embeddings[command.ticket] = embeddings

        self.answer(command.ticket, lambda: self.engine.embed(command.sequences, done).id)

    def collect(self, event: TokenEvent) -> None:
        self.update.events.append(detached(event))

    def report(self) -> None:
        """Send the update when it holds anything new, or when the last went out HEARTBEAT_SECONDS ago."""
        update = self.update
        update.snapshot = EngineSnapshot.of(self.engine)
        now = time.monotonic()
        if (update.events or update.answers or update.embeddings or update.error or update.snapshot != self.reported
                or now - self.sent_at >= HEARTBEAT_SECONDS):
            self.connection.send(update)
            self.reported, self.sent_at = update.snapshot, now
            self.update = Update(update.snapshot)

    def close(self) -> None:
        """Cancel what waits or runs (their last events go out), report the pool empty."""
        self.engine.stop_admitting()
        self.engine.cancel_all()
        self.engine.run_until_idle()
        self.report()


# ---- the HTTP process's side -------------------------------------------------------------------------


class ProcessEngineClient(EngineClient):
    """The engine in a process of its own, built there by ``build``: a picklable callable (a module-level
    function, or a ``functools.partial`` of one) that loads the model and returns the Engine. Construction
    waits until the engine is ready; an EngineStartError says why it could not be built. ``stall_timeout``:
    ``EngineClient``'s."""

    def __init__(self, build: Callable[[], Engine], tokenizer,
                 stall_timeout: float | None = DEFAULT_STALL_SECONDS) -> None:
        self._tickets = itertools.count()
        # ticket -> its submitter: its future, its sink (a transcription's: each window's) and sequences a request
        self._pending: dict[int, tuple[asyncio.Future, EventSink | Callable[[int], EventSink], int]] = {}
        self._embedding: dict[int, asyncio.Future] = {}  # ticket -> an embeddings request's waiter
        self._embedding_ids: dict[int, int] = {}  # ticket -> its request's id, once the engine has answered
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_commands, name="tformer-engine-commands", daemon=True)
        self._ended = asyncio.Event()  # the engine process's end of the pipe closed
        self._closing = False  # Close sent: the engine process's end is expected
        self._closed = False
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of this one's threads
        self._connection, child_end = context.Pipe()
        self._fd = self._connection.fileno()
        self.process = context.Process(target=run_engine_process, args=(child_end, build), name="tformer-engine")
        with _shutdown_signals_ignored():  # inherited: a Ctrl-C while the engine process starts is this one's
            self.process.start()
        child_end.close()  # the engine's end lives in the engine process only: its exit ends the pipe here
        atexit.register(self.close)  # runs before multiprocessing's exit hook, which would wait for the process
        try:
            first = self._connection.recv()
        except EOFError:
            self.close()
            raise EngineStartError(f"the engine process exited with code {self.process.exitcode} before it was "
                                   "ready") from None
        except BaseException:  # Ctrl-C while the model loads
            self.close()
            raise
        if isinstance(first, StartFailed):
            self.close()
            raise EngineStartError(first.message)
        super().__init__(tokenizer, first.facts, stall_timeout)
        self._snapshot = first.snapshot

    def start(self) -> None:
        self._heard = time.monotonic()
        asyncio.get_running_loop().add_reader(self._fd, self._read)
        self._sender.start()

    def _heard_now(self) -> bool:
        try:
            return not self._closed and self._connection.poll()
        except OSError:
            return False

    async def submit(self, prompt_ids: list[int], config: GenerationConfig, n: int, logprobs: int | None,
                     prompt_logprobs: int | None, sink: EventSink, adapter: str | None = None) -> int:
        if self.error is not None or self._ended.is_set():
            raise EngineFailure(self.error or "the engine has stopped")
        ticket = next(self._tickets)
        future = asyncio.get_running_loop().create_future()
        self._pending[ticket] = (future, sink, n)
        self._commands.put(Submit(ticket, list(prompt_ids), config, n, logprobs, prompt_logprobs, adapter))
        return await future

    async def transcribe(self, samples: np.ndarray, config: GenerationConfig, language: str | None,
                         logprobs: int | None, sink_for: Callable[[int], EventSink]) -> list[int]:
        if self.error is not None or self._ended.is_set():
            raise EngineFailure(self.error or "the engine has stopped")
        ticket = next(self._tickets)
        future = asyncio.get_running_loop().create_future()
        self._pending[ticket] = (future, sink_for, 1)
        self._commands.put(Transcribe(ticket, samples, config, language, logprobs))
        return await future

    async def embed(self, sequences: list[list[int]]) -> Embeddings:
        if self.error is not None or self._ended.is_set():
            raise EngineFailure(self.error or "the engine has stopped")
        ticket = next(self._tickets)
        answer = asyncio.get_running_loop().create_future()
        self._embedding[ticket] = answer
        self._commands.put(Embed(ticket, [list(ids) for ids in sequences]))
        try:
            return await answer
        except asyncio.CancelledError:
            self._embedding.pop(ticket, None)
            request_id = self._embedding_ids.pop(ticket, None)
            if request_id is not None:
                self._commands.put(Cancel(request_id))
            raise

    def _cancel(self, request_id: int) -> None:
        self._commands.put(Cancel(request_id))

    def cancel_all(self) -> None:
        self._commands.put(CancelAll())

    def stop_admitting(self) -> None:
        self.admitting = False
        self._commands.put(StopAdmitting())

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    async def stop(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        self.admitting = False
        self._closing = True
        self._commands.put(Close())
        if not self.unresponsive():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), timeout)
        self.close(0.0 if self.unresponsive() else max(0.0, deadline - time.monotonic()))

    def close(self, grace: float = CLOSE_SECONDS) -> None:
        """End the engine process now: its pipe closes (it exits at its next look), killed if still there
        after ``grace`` seconds (``forced``)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._commands.put(None)
        self._connection.close()
        self.process.join(grace)
        if self.process.is_alive():
            self.forced = True
            self.process.kill()  # SIGKILL ends a stopped process too
            self.process.join()

    def kill(self) -> None:
        self.process.kill()

    # ---- on the event loop ----------------------------------------------------------------------------

    def _read(self) -> None:
        """Apply every update waiting on the pipe (the engine writes each whole, so none is read in part)."""
        self._heard = time.monotonic()
        try:
            while self._connection.poll():
                self._apply(self._connection.recv())
        except (EOFError, OSError):
            self._end()

    def _apply(self, update: Update) -> None:
        for ticket, answer in update.answers.items():
            if ticket not in self._pending:  # an embeddings request's
                self._embedding_answered(ticket, answer)
                continue
            future, sink, n = self._pending.pop(ticket)
            if isinstance(answer, str | SubmitFailed):
                if not future.cancelled():
                    future.set_exception(GenerationError(answer) if isinstance(answer, str)
                                         else EngineBug(answer.error_type))
            elif future.cancelled():  # its submitter is gone: nobody reads its events
                for request_id in answer if isinstance(answer, list) else [answer]:
                    self._commands.put(Cancel(request_id))
            elif isinstance(answer, list):  # a transcription's windows
                for window, request_id in enumerate(answer):
                    self._follow(request_id, sink(window), n)
                future.set_result(answer)
            else:
                self._follow(answer, sink, n)
                future.set_result(answer)
        for ticket, embeddings in update.embeddings.items():
            self._embedding_ids.pop(ticket, None)
            waiter = self._embedding.pop(ticket, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(embeddings)
        self._route(update.events)
        self._snapshot = update.snapshot
        if update.error is not None:
            self.error = update.error

    def _embedding_answered(self, ticket: int, answer: int | str | SubmitFailed) -> None:
        """The engine took an embeddings request (its id, to cancel it by) or refused it."""
        waiter = self._embedding.get(ticket)
        if isinstance(answer, int):
            if waiter is None:  # its waiter is gone: nobody reads its vectors
                self._commands.put(Cancel(answer))
            else:
                self._embedding_ids[ticket] = answer
            return
        self._embedding.pop(ticket, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(GenerationError(answer) if isinstance(answer, str) else EngineBug(answer.error_type))

    def _end(self) -> None:
        """The engine process ended (a failure, a crash, or ``Close``): fail the submits waiting for answers."""
        asyncio.get_running_loop().remove_reader(self._fd)
        if self.error is None and not (self._closing or self._closed):
            self.process.join(1.0)
            self.error = f"the engine process ended (exit code {self.process.exitcode})"
        for future, _, _ in self._pending.values():
            if not future.done():
                future.set_exception(EngineFailure(self.error or "the engine has stopped"))
        self._pending.clear()
        for waiter in self._embedding.values():
            if not waiter.done():
                waiter.set_exception(EngineFailure(self.error or "the engine has stopped"))
        self._embedding.clear()
        self._ended.set()

    # ---- on the sender thread (so the event loop never blocks on a full pipe) ------------------------

    def _send_commands(self) -> None:
        while (command := self._commands.get()) is not None:
            try:
                self._connection.send(command)
            except OSError:  # the engine process is gone: the reader sees the pipe's end
                return


@contextlib.contextmanager
def _shutdown_signals_ignored():
    """SIGINT and SIGTERM ignored while inside (on the main thread, the only one that may set handlers): a
    process started meanwhile ignores them from its first instruction, before it could set that itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SHUTDOWN_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
