"""The HTTP requests in flight, and how a stop ends them: the bodies still arriving, the submissions not yet
answered, the waits on the engine (which give up on an engine that failed or stalled), and the drain a signal
starts (``InFlight.begin_stop``; the signals themselves are ``lifecycle``'s).

A stop refuses new requests and the bodies still arriving (503), gives the requests in flight a deadline,
cancels those still running at it, and ends itself those the engine has not ended STOP_GRACE_SECONDS later
(``drained``): a whole answer then becomes a 503 error object, a stream ends with finish reason "cancelled".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest

from tformer.serving.engine_client import EngineClient
from tformer.serving.openai_api import APIError

STOP_GRACE_SECONDS = 1.0  # after the shutdown timeout: time the engine gets to end the requests it cancelled
POLL_SECONDS = 0.25  # how often a waiting handler looks for a failed or stalled engine
T = TypeVar("T")


class ClientGone(Exception):
    """The client closed its connection before its answer (mid-body or while it was decoded)."""


def cut_by_shutdown() -> APIError:
    """The answer of a request the shutdown timeout cut."""
    return APIError(503, "the server is shutting down: this request was cancelled when the shutdown timeout passed",
                    code="shutting_down")


def shutting_down() -> APIError:
    """The answer of a request that arrives (or is still arriving) once the server stops admitting."""
    return APIError(503, "the server is shutting down", code="shutting_down")


def _retrieved(future: asyncio.Future) -> None:
    """Read a finished future's outcome, so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


class InFlight:
    """The requests one server has in flight over ``engine``, and the stop that drains them. Every method runs
    on the server's event loop except ``begin_stop`` and ``stop_now``, which a signal handler calls."""

    def __init__(self, engine: EngineClient, max_body_bytes: int) -> None:
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        self.submissions: set[object] = set()  # the ``Submission``s whose HTTP requests are not over
        self._reading: set[asyncio.Task] = set()  # the handlers still reading a body
        self._refused: set[asyncio.Task] = set()  # those of them begin_stop cancelled, to answer 503
        self.stop_deadline: float | None = None  # set by begin_stop: when requests in flight are cancelled
        self._cancelled_in_flight = False
        self.given_up_at: float | None = None  # when the server began to end the cancelled requests itself
        self._event_loop: asyncio.AbstractEventLoop | None = None

    def serve_on(self, event_loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the requests run on (where a stop's work is done)."""
        self._event_loop = event_loop

    async def read_body(self, http_request: HTTPRequest) -> bytes:
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
            raise shutting_down() from None
        finally:
            self._reading.discard(task)
            self._refused.discard(task)
        return b"".join(chunks)

    # ---- the stop ------------------------------------------------------------------------------------

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
    def stopping(self) -> bool:
        return self.stop_deadline is not None

    @property
    def given_up(self) -> bool:
        return self.given_up_at is not None

    def drained(self) -> bool:
        """After ``begin_stop``: whether the requests in flight are over. Past the deadline they are cancelled;
        those the engine has not ended STOP_GRACE_SECONDS later (at once when it is unresponsive) the server ends
        itself (``given_up``), each at its next look, within POLL_SECONDS."""
        if not self.submissions and not self._reading:
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

    # ---- waiting on the engine -----------------------------------------------------------------------

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

    def check_admitting(self) -> None:
        """A 503 once the server stops admitting, or whatever ``check_in_flight`` finds."""
        if not self.engine.admitting:
            raise shutting_down()
        self.check_in_flight()
