"""The OpenAI-compatible HTTP server: Starlette routes in front of one ``EngineClient`` (the engine in a
process of its own, or on a thread of this one). The pieces, one concern each:

- ``served.ServedModel``: what the routes read (engine, tokenizer, model name, chat template, limits) and the
  checks they share; ``submission.Submission``, the one path from a route's prompts to the engine's events,
  streamed as server-sent events or gathered into one response; a client that goes away, mid-stream or while
  waiting for a whole answer, has its request cancelled at once (the engine stops at its next step).
- ``routes``: completions, chat completions, embeddings, audio transcriptions, tokenize / detokenize /
  tokenizer_info, models, health, metrics.
- ``inflight.InFlight``: the requests in flight, the waits on the engine (a stalled engine,
  ``EngineClient.stall``, fails the requests waiting on it with 503 and makes /health answer 503 until it shows
  life again) and the drain a stop starts.
- ``lifecycle``: signals, the bound on a stop (``Backstop``) and the uvicorn runner (``run``).

This module holds the server object: the route table, the API-key check, errors as OpenAI error objects, and
the engine started and stopped with the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tformer.serving.inflight import ClientGone
from tformer.serving.lifecycle import ENGINE_STOP_SECONDS, Backstop, run, uvicorn_server
from tformer.serving.openai_api import APIError
from tformer.serving.routes.chat_completions import chat_completions
from tformer.serving.routes.completions import completions
from tformer.serving.routes.embeddings import embeddings
from tformer.serving.routes.status import health, metrics, models
from tformer.serving.routes.tokens import detokenize, tokenize, tokenizer_info
from tformer.serving.routes.transcriptions import transcriptions
from tformer.serving.served import ServedModel

__all__ = ["Backstop", "OpenAIServer", "run", "uvicorn_server"]

CLIENT_CLOSED_REQUEST = 499  # the status counted for a client that left before its answer (never sent)
RouteHandler = Callable[[ServedModel, HTTPRequest], Awaitable[Response]]
# path -> (method, handler, whether it is open without the API key)
ROUTES: dict[str, tuple[str, RouteHandler, bool]] = {
    "/v1/completions": ("POST", completions, False),
    "/v1/chat/completions": ("POST", chat_completions, False),
    "/v1/embeddings": ("POST", embeddings, False),
    "/v1/audio/transcriptions": ("POST", transcriptions, False),
    "/v1/models": ("GET", models, False),
    "/tokenize": ("POST", tokenize, False),
    "/detokenize": ("POST", detokenize, False),
    "/tokenizer_info": ("GET", tokenizer_info, False),
    "/health": ("GET", health, True),
    "/metrics": ("GET", metrics, False),
}


class OpenAIServer(ServedModel):
    """The routes (``ROUTES``) over one engine, as one ASGI app. ``ServedModel`` takes the options."""

    def app(self) -> Callable[[dict, Callable, Callable], Awaitable[None]]:
        """The ASGI app: the routes. A handler that uvicorn cancels once a stop has waited for it (its client reads
        nothing: ``lifecycle.CLOSE_WAIT_SECONDS``) ends quietly: a stop logs no traceback."""
        routes = [Route(path, self._endpoint(handler, open_), methods=[method])
                  for path, (method, handler, open_) in ROUTES.items()]
        starlette = Starlette(routes=routes, exception_handlers={HTTPException: self._http_exception},
                              lifespan=self._lifespan)

        async def app(scope: dict, receive: Callable, send: Callable) -> None:
            try:
                await starlette(scope, receive, send)
            except asyncio.CancelledError:
                if not self.flight.stopping:
                    raise

        return app

    def _endpoint(self, handler: RouteHandler, open_: bool) -> Callable[[HTTPRequest], Awaitable[Response]]:
        """``handler`` behind the API-key check (unless ``open_``), its APIErrors answered as OpenAI error
        objects, every answer counted for /metrics."""
        route = partial(handler, self)

        async def endpoint(http_request: HTTPRequest) -> Response:
            try:
                if not open_:
                    self._check_key(http_request)
                response = await route(http_request)
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
        self.flight.serve_on(asyncio.get_running_loop())
        self.engine.start()
        try:
            yield
        finally:
            if not self.flight.stopping:
                await self.engine.stop()
            else:  # a signal's stop: the requests are over, the engine has nothing left to finish
                await self.engine.stop(ENGINE_STOP_SECONDS)

    def _check_key(self, http_request: HTTPRequest) -> None:
        if self.api_key is None:
            return
        given = http_request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise APIError(401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key")
