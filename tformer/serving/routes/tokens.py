"""The tokenizer's routes: POST /tokenize (the ids a completion or chat completion would prefill), POST
/detokenize, and GET /tokenizer_info (what a client needs to tokenize as the server does)."""

from __future__ import annotations

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from tformer.serving.openai_api import APIError, DetokenizeRequest, TokenizeRequest, parse_body
from tformer.serving.served import ServedModel
from tformer.tokenizers.errors import TokenizerError


async def tokenize(served: ServedModel, http_request: HTTPRequest) -> Response:
    """The ids a completion or chat completion would prefill for the same prompt or messages."""
    body: TokenizeRequest = parse_body(await served.read_body(http_request), TokenizeRequest)
    if body.model is not None:
        served.check_model(body.model)
    if body.messages is not None:
        text = await served.chat_text(body.messages, body.add_generation_prompt is not False)
    else:
        text = body.prompt
    tokens = served.tokenizer.encode(text, add_special_tokens=body.special_tokens)
    return JSONResponse({"count": len(tokens), "max_model_len": served.engine.facts.position_limit, "tokens": tokens})


async def detokenize(served: ServedModel, http_request: HTTPRequest) -> Response:
    body: DetokenizeRequest = parse_body(await served.read_body(http_request), DetokenizeRequest)
    if body.model is not None:
        served.check_model(body.model)
    try:
        text = served.tokenizer.decode(body.tokens)
    except TokenizerError as error:  # an id outside the vocabulary
        raise APIError(400, str(error), "tokens") from None
    return JSONResponse({"prompt": text})


async def tokenizer_info(served: ServedModel, http_request: HTTPRequest) -> Response:
    """What a client needs to tokenize as the server does (the fields vLLM's route returns that apply)."""
    tokenizer, facts = served.tokenizer, served.engine.facts
    return JSONResponse({
        "tokenizer_class": type(tokenizer).__name__, "kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
        **{f"{role}_token": tokenizer.special_token(role) for role in ("bos", "eos", "pad", "unk")},
        "special_tokens": tokenizer.special_tokens,
        "end_token_ids": list(facts.end_token_ids),  # where an answer stops by default
        "chat_template": None if served.chat_template is None else served.chat_template.source,
        "max_model_len": facts.position_limit,
    })
