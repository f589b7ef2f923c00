"""The server's life under uvicorn: it serves until a signal, drains, and stops within a bound.

SIGTERM (or SIGINT) stops admitting while still listening (new requests, and requests whose body is still
arriving, get 503), lets the requests in flight finish for ``shutdown_timeout`` seconds, cancels the rest (a
whole answer becomes a 503 error object, a stream ends with finish reason "cancelled" and ``[DONE]``; what the
engine has not ended STOP_GRACE_SECONDS later the server ends itself: ``inflight.InFlight``), then closes the
listener, stops the engine (killed if it has not exited within ENGINE_STOP_SECONDS) and exits 0. A second signal
does all of that at once. Whatever hangs, the process exits STOP_MARGIN_SECONDS past the timeout (past a second
signal: SECOND_SIGNAL_SECONDS), with a line saying so and status 1 (``Backstop``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from tformer.serving.engine_client import EngineClient
from tformer.serving.inflight import InFlight

if TYPE_CHECKING:
    import uvicorn

ENGINE_STOP_SECONDS = 1.0  # after a signal, once the requests are over: time the engine gets to exit before a kill
CLOSE_WAIT_SECONDS = 1.0  # then uvicorn's wait for the last bytes of answers (a client that does not read)
STOP_MARGIN_SECONDS = 5.0  # past the shutdown timeout, the process exits whatever is left
SECOND_SIGNAL_SECONDS = 3.0  # past a second signal, the same
# With --engine thread, the engine's thread waits for the GIL whenever the HTTP thread holds it; forced
# switches every 0.5 ms instead of Python's 5 bound that wait. Measured at 16 gpt-mini clients, 5, 0.5 and
# 0.1 ms give the same throughput (docs/serving.md): the HTTP thread's work after each step, not the
# interval, is what the engine waits for.
SWITCH_INTERVAL = 0.0005


class Servable(Protocol):
    """What running a server needs of it (``server.OpenAIServer``): its ASGI app, its engine, the name it serves
    and its requests in flight (what a signal drains)."""

    engine: EngineClient
    model_name: str
    flight: InFlight

    def app(self) -> Callable[[dict, Callable, Callable], Awaitable[None]]: ...


def run(server: Servable, host: str = "127.0.0.1", port: int = 8000, shutdown_timeout: float = 30.0,
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


def uvicorn_server(server: Servable, host: str, port: int, shutdown_timeout: float, log_level: str,
                   backstop: Backstop | None = None) -> uvicorn.Server:
    """A uvicorn server for ``server`` whose first SIGTERM or SIGINT drains while still listening (new requests
    get 503: ``InFlight.begin_stop``) and closes the listener once ``drained``; a second one ends the requests
    in flight at once (``InFlight.stop_now``). Each signal arms ``backstop``."""
    import uvicorn

    flight = server.flight

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            if not flight.stopping:
                error = server.engine.error  # an engine that stopped (killed, its model failed) runs nothing
                running = server.engine.snapshot().running
                in_flight = (f"none in flight: the engine had stopped ({error})" if error is not None else
                             f"{running} sequence(s) in flight get up to {shutdown_timeout:g} s")
                print(f"tformer serve: stopping: no new requests; {in_flight}", file=sys.stderr, flush=True)
                flight.begin_stop(shutdown_timeout)
                if backstop is not None:
                    backstop.arm(shutdown_timeout + STOP_MARGIN_SECONDS, f"the stop took over --shutdown-timeout "
                                 f"{shutdown_timeout:g} s + {STOP_MARGIN_SECONDS:g} s")
            else:
                print("tformer serve: a second signal: ending the requests in flight now", file=sys.stderr,
                      flush=True)
                flight.stop_now()
                if backstop is not None:
                    backstop.arm(SECOND_SIGNAL_SECONDS, f"the stop took over {SECOND_SIGNAL_SECONDS:g} s after a "
                                 "second signal")

        async def on_tick(self, counter: int) -> bool:
            if flight.stopping and not self.should_exit and flight.drained():
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
