"""POST /v1/chat/completions: messages rendered by the model's chat template and answered ``n`` times, as one
answer or streamed, with the answer tokens' log-probabilities when asked; an answer ends at the model's end ids
or at the template's end-of-turn token (``ServedModel.chat_end_ids``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from tformer.serving.openai_api import (
    APIError,
    ChatRequest,
    chat_logprob_entry,
    new_id,
    parse_body,
    response_object,
    sse,
    usage,
)
from tformer.serving.served import ServedModel
from tformer.serving.submission import Submission, stream_response
from tformer.serving.wire import TokenEvent

CHAT_COMPLETION = "chat.completion"  # the response object's kind


async def chat_completions(served: ServedModel, http_request: HTTPRequest) -> Response:
    body: ChatRequest = parse_body(await served.read_body(http_request), ChatRequest)
    adapter = served.check_model(body.model)
    served.check_generates()
    served.check_admitting()
    text = await served.chat_text(body.messages)
    prompt = served.tokenizer.encode(text, add_special_tokens=False)
    if not prompt:
        raise APIError(400, "the messages render to no tokens", "messages")
    tokens = served.token_limit(body.token_limit, [prompt], None)
    served.check_request_tokens([prompt], body.n, tokens)
    top = (body.top_logprobs or 0) if body.logprobs else None
    config = body.generation_config(tokens, served.engine.facts.generation_defaults)
    if not body.ignore_eos:  # the end of the assistant's turn as well as the model's end ids
        config = config.replace(eos_token_id=served.chat_end_ids)
    submission = await served.submit(http_request, [prompt], config, body.n, top, adapter=adapter)
    answer = _ChatAnswer(served, submission, new_id("chatcmpl"), body.model)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return await stream_response(submission, answer.chunks(include_usage))
    try:
        return await answer.whole(body.logprobs)
    finally:
        submission.close()


class _ChatAnswer:
    """One chat completions answer being built from its submission's events."""

    def __init__(self, served: ServedModel, submission: Submission, response_id: str, model: str) -> None:
        self.served = served
        self.submission = submission
        self.response_id = response_id
        self.model = model  # the name the request gave (the base model's or an adapter's)

    def _response(self, choices: list[dict[str, Any]], counts: dict | None, chunk: bool = False) -> dict[str, Any]:
        return response_object(CHAT_COMPLETION, self.response_id, self.model, choices, counts, chunk=chunk)

    def _usage(self) -> dict[str, int]:
        return usage(self.submission.prompt_tokens, self.submission.completion_tokens)

    def _logprob_entry(self, event: TokenEvent) -> dict[str, Any]:
        return chat_logprob_entry(self.served.token_text(event.token_id), event.logprob, self.served.top(event))

    async def whole(self, with_logprobs: bool) -> Response:
        choices: dict[int, dict[str, Any]] = {}
        async for index, event in self.submission.events():
            choice = choices.setdefault(index, {"content": "", "logprobs": [] if with_logprobs else None,
                                                "finish_reason": None})
            choice["content"] += event.text
            if event.token_id >= 0 and event.logprob is not None:
                choice["logprobs"].append(self._logprob_entry(event))
            if event.finish_reason is not None:
                choice["finish_reason"] = event.finish_reason
        listed = [{"index": index, "message": {"role": "assistant", "content": choice["content"]},
                   "logprobs": None if choice["logprobs"] is None else {"content": choice["logprobs"]},
                   "finish_reason": choice["finish_reason"]} for index, choice in sorted(choices.items())]
        self.submission.check_answered()
        return JSONResponse(self._response(listed, self._usage()))

    async def chunks(self, include_usage: bool) -> AsyncIterator[bytes]:
        opened: set[int] = set()
        async for index, event in self.submission.events():
            delta: dict[str, Any] = {} if event.token_id < 0 else {"content": event.text}
            if index not in opened:
                opened.add(index)
                delta = {"role": "assistant", **delta}
            logprobs = None
            if event.token_id >= 0 and event.logprob is not None:
                logprobs = {"content": [self._logprob_entry(event)]}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": event.finish_reason}
            yield sse(self._response([choice], None, chunk=True))
        if include_usage:
            yield sse(self._response([], self._usage(), chunk=True))
