"""POST /v1/embeddings: each input (a text or token ids) turned into one vector by the served model's pooling
(``models.embeddings``), in the engine's batches; as float lists, or base64 of little-endian float32 (what OpenAI's
client decodes)."""

from __future__ import annotations

import array
import asyncio
import base64
import sys

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from tformer.generation.settings import GenerationError
from tformer.serving.engine_client import EngineBug, EngineFailure
from tformer.serving.inflight import ClientGone, cut_by_shutdown
from tformer.serving.openai_api import APIError, EmbeddingRequest, parse_body
from tformer.serving.served import ServedModel
from tformer.serving.wire import EmbeddingFacts, Embeddings


async def embeddings(served: ServedModel, http_request: HTTPRequest) -> Response:
    body: EmbeddingRequest = parse_body(await served.read_body(http_request), EmbeddingRequest)
    if served.check_model(body.model) is not None:
        raise APIError(400, f"model {body.model!r} is a LoRA adapter, which serves completions; embeddings are the "
                            f"base model's: model {served.model_name!r}", "model")
    facts = _embedding_facts(served)
    if body.dimensions is not None and body.dimensions != facts.dimensions:
        raise APIError(400, f"dimensions={body.dimensions} is not supported: model {served.model_name!r} gives "
                            f"{facts.dimensions}-dimensional vectors and cannot shorten them", "dimensions")
    served.check_admitting()
    sequences = served.prompt_ids(body.inputs(), 1, "input")
    limit = facts.max_tokens
    for index, ids in enumerate(sequences):
        if limit is not None and len(ids) > limit:
            raise APIError(400, f"input {index} has {len(ids):,} tokens; model {served.model_name!r} reads at most "
                                f"{limit:,} (its context)", "input")
    answer = await _embedded(served, http_request, sequences)
    encode = _base64 if body.encoding_format == "base64" else _floats
    data = [{"object": "embedding", "index": index, "embedding": encode(vector)}
            for index, vector in enumerate(answer.vectors)]
    tokens = sum(len(ids) for ids in sequences)
    return JSONResponse({"object": "list", "data": data, "model": served.model_name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _embedding_facts(served: ServedModel) -> EmbeddingFacts:
    """How the model embeds; a 400 when the server was started without a pooling for it."""
    facts = served.engine.facts.embedding
    if facts is None:
        raise APIError(400, f"model {served.model_name!r} has no pooling, so it serves no embeddings (start tformer "
                            "serve with --pooling cls, mean or last)", "model", "no_pooling")
    return facts


async def _embedded(served: ServedModel, http_request: HTTPRequest, sequences: list[list[int]]) -> Embeddings:
    """The engine's vectors for ``sequences``, waited for as a request in flight (a stop waits for it, a stalled or
    failed engine fails it); a client that leaves cancels it."""
    flight = served.flight
    marker = object()  # in flight until answered: a stop waits for it
    flight.submissions.add(marker)
    try:
        answer = await flight.from_engine(_unless_gone(served, http_request, sequences))
    except GenerationError as error:
        raise APIError(400, str(error), "input") from None
    except EngineFailure as error:
        raise APIError(500, f"the model failed: {error}") from None
    except EngineBug as error:
        raise APIError(500, f"internal error: {error}") from None
    finally:
        flight.submissions.discard(marker)
    if answer.error is not None:  # cancelled by a stop
        raise cut_by_shutdown()
    return answer


async def _unless_gone(served: ServedModel, http_request: HTTPRequest, sequences: list[list[int]]) -> Embeddings:
    """The engine's answer, or ClientGone (the request cancelled) when the client closes its connection first."""
    answer = asyncio.ensure_future(served.engine.embed(sequences))
    gone = asyncio.ensure_future(_disconnected(http_request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            return answer.result()
        raise ClientGone
    finally:
        for task in (answer, gone):
            task.cancel()


async def _disconnected(http_request: HTTPRequest) -> None:
    """Return when the client closes its connection (the body is read: nothing else arrives before that)."""
    while (await http_request.receive())["type"] != "http.disconnect":
        pass


def _floats(vector: bytes) -> list[float]:
    values = array.array("f", vector)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def _base64(vector: bytes) -> str:
    return base64.b64encode(vector).decode("ascii")
