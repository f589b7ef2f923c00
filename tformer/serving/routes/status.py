"""The server's status: GET /health (is the engine running, stalled, failed, stopping), GET /v1/models (the model
served, then each LoRA adapter served over it, its ``parent`` the model) and GET /metrics (Prometheus' text
format)."""

from __future__ import annotations

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from tformer.serving.served import ServedModel


async def health(served: ServedModel, http_request: HTTPRequest) -> Response:
    engine = served.engine
    if engine.error is not None:
        return JSONResponse({"status": "failed", "error": engine.error}, status_code=500)
    stall = engine.stall()
    if stall is not None:
        return JSONResponse({"status": "stalled", "error": stall}, status_code=503)
    if not engine.admitting:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def models(served: ServedModel, http_request: HTTPRequest) -> Response:
    def entry(name: str, parent: str | None) -> dict:
        return {"id": name, "object": "model", "created": served.created, "owned_by": "tformer",
                "max_model_len": served.engine.facts.position_limit, "root": served.model_name, "parent": parent}

    return JSONResponse({"object": "list", "data": [entry(served.model_name, None),
                                                    *(entry(name, served.model_name)
                                                      for name in served.engine.facts.adapters)]})


async def metrics(served: ServedModel, http_request: HTTPRequest) -> Response:
    return PlainTextResponse(metrics_text(served), media_type="text/plain; version=0.0.4")


def metrics_text(served: ServedModel) -> str:
    """Prometheus' text format: counters and gauges of the engine and the HTTP side."""
    snapshot, facts = served.engine.snapshot(), served.engine.facts
    stats = snapshot.stats
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP tformer_{name} {help_text}", f"# TYPE tformer_{name} {kind}"])
        lines.extend(f"tformer_{name}{labels} {value}" for labels, value in samples)

    metric("requests_total", "counter", "Engine requests by outcome.",
           [('{outcome="submitted"}', stats.requests_submitted), ('{outcome="finished"}', stats.requests_finished),
            ('{outcome="cancelled"}', stats.requests_cancelled), ('{outcome="timeout"}', stats.requests_timed_out)])
    metric("http_responses_total", "counter", "HTTP responses by status code.",
           [(f'{{code="{code}"}}', count) for code, count in sorted(served.responses.items())])
    metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", [("", stats.prompt_tokens)])
    metric("prompt_tokens_computed_total", "counter", "Prompt tokens the model ran (every sequence's).",
           [("", stats.prompt_tokens_computed)])
    metric("prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
           [("", stats.prefix_cache_hit_tokens)])
    metric("prefix_cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache / prompt tokens.",
           [("", stats.prefix_cache_hit_rate)])
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", stats.generated_tokens)])
    metric("engine_steps_total", "counter", "Engine steps (one forward each).", [("", stats.steps)])
    metric("embedding_requests_total", "counter", "Embeddings requests answered.", [("", stats.embedding_requests)])
    metric("embedded_inputs_total", "counter", "Inputs embedded.", [("", stats.embedded_inputs)])
    metric("embedded_tokens_total", "counter", "Tokens of the inputs embedded.", [("", stats.embedded_tokens)])
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
