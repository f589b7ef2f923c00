"""POST /v1/chat/completions: messages rendered by the model's chat template and answered ``n`` times, as one
answer or streamed, with the answer tokens' log-probabilities when asked; an answer ends at the model's end ids
or at the template's end-of-turn token (``ServedModel.chat_end_ids``). With ``tools`` (``tool_calls.py``), the
functions are offered to the model and each reply is parsed into content and ``tool_calls``; ``tool_choice``
"required" or a named function constrains decoding to the call's JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from tformer.generation.constraints import Constraint
from tformer.generation.settings import GenerationConfig, GenerationError
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
from tformer.serving.tool_call_parser import ToolCallParser
from tformer.serving.tool_calls import ToolRequest, read_tools
from tformer.serving.wire import TokenEvent

CHAT_COMPLETION = "chat.completion"  # the response object's kind


async def chat_completions(served: ServedModel, http_request: HTTPRequest) -> Response:
    body: ChatRequest = parse_body(await served.read_body(http_request), ChatRequest)
    tools = read_tools(body.tools, body.tool_choice, body.parallel_tool_calls)
    adapter = served.check_model(body.model)
    served.check_generates()
    served.check_admitting()
    text = body.continued(await served.chat_text(body.messages, body.opens_turn, tools=tools))
    (prompt,) = body.truncated([served.tokenizer.encode(text, add_special_tokens=False)])
    if not prompt:
        raise APIError(400, "the messages render to no tokens", "messages")
    tokens = served.token_limit(body.token_limit, [prompt], None)
    served.check_request_tokens([prompt], body.n, tokens)
    top = (body.top_logprobs or 0) if body.logprobs else None
    config = body.generation_config(tokens, served.engine.facts.generation_defaults)
    if not body.ignore_eos:  # the end of the assistant's turn as well as the model's end ids
        config = config.replace(eos_token_id=served.chat_end_ids)
    if tools is not None and tools.constrained:
        config = _calls_constrained(config, tools)
    submission = await served.submit(http_request, [prompt], config, body.n, top, adapter=adapter)
    answer = _ChatAnswer(served, submission, new_id("chatcmpl"), body.model, tools)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return await stream_response(submission, answer.chunks(include_usage))
    try:
        return await answer.whole(body.logprobs)
    finally:
        submission.close()


def _calls_constrained(config: GenerationConfig, tools: ToolRequest) -> GenerationConfig:
    """``config`` with decoding held to the JSON of the call(s) ``tool_choice`` asks for (``required``: an array of
    calls to the tools; a named function: one call to it), so the arguments always validate against the
    function's parameters; a 400 when another constraint (``response_format``) is already set, or the schema does
    not compile."""
    choice = "'required'" if tools.choice == "required" else f"naming function {tools.named!r}"
    if config.constraint is not None:
        raise APIError(400, f"tool_choice {choice} constrains the reply to a function call, and response_format "
                            "constrains it too: give one of them", "tool_choice")
    try:
        return config.replace(constraint=Constraint.json_schema(tools.call_schema()))
    except GenerationError as error:
        raise APIError(400, f"tool_choice {choice}: the call's schema (from tools' parameters) {error}",
                       "tools") from None


class _ChatAnswer:
    """One chat completions answer being built from its submission's events; with ``tools``, each choice's text
    read by a ``ToolCallParser`` into content and ``tool_calls``."""

    def __init__(self, served: ServedModel, submission: Submission, response_id: str, model: str,
                 tools: ToolRequest | None = None) -> None:
        self.served = served
        self.submission = submission
        self.response_id = response_id
        self.model = model  # the name the request gave (the base model's or an adapter's)
        self.tools = tools
        self.parsers: dict[int, ToolCallParser] = {}  # choice -> its reply's parser (with tools)

    def _tool_deltas(self, index: int, event: TokenEvent) -> list[dict[str, Any]]:
        """The deltas choice ``index``'s event lets out of its parser (the held text too at its end)."""
        parser = self.parsers.setdefault(index, ToolCallParser(self.tools))
        deltas = parser.feed(event.text)
        if event.finish_reason is not None:
            deltas += parser.finish()
        return deltas

    def _finish_reason(self, index: int, reason: str | None) -> str | None:
        """"tool_calls" for a choice that stopped after calling functions, else the engine's reason."""
        parser = self.parsers.get(index)
        return "tool_calls" if reason == "stop" and parser is not None and parser.has_calls else reason

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
            if self.tools is not None:  # fed as the stream's pieces, so the stream reassembles to this reply
                self._tool_deltas(index, event)
            if event.token_id >= 0 and event.logprob is not None:
                choice["logprobs"].append(self._logprob_entry(event))
            if event.finish_reason is not None:
                choice["finish_reason"] = self._finish_reason(index, event.finish_reason)
        listed = [{"index": index,
                   "message": (self.parsers[index].message() if self.tools is not None
                               else {"role": "assistant", "content": choice["content"]}),
                   "logprobs": None if choice["logprobs"] is None else {"content": choice["logprobs"]},
                   "finish_reason": choice["finish_reason"]} for index, choice in sorted(choices.items())]
        self.submission.check_answered()
        return JSONResponse(self._response(listed, self._usage()))

    async def chunks(self, include_usage: bool) -> AsyncIterator[bytes]:
        opened: set[int] = set()
        async for index, event in self.submission.events():
            if self.tools is None:
                deltas: list[dict[str, Any]] = [{} if event.token_id < 0 else {"content": event.text}]
            else:  # content and tool-call deltas, none while text is held
                deltas = self._tool_deltas(index, event) or [{}]
            logprobs = None
            if event.token_id >= 0 and event.logprob is not None:
                logprobs = {"content": [self._logprob_entry(event)]}
            if deltas == [{}] and self.tools is not None and index in opened and logprobs is None \
                    and event.finish_reason is None:
                continue  # nothing to send yet
            for number, delta in enumerate(deltas):
                if index not in opened:
                    opened.add(index)
                    delta = {"role": "assistant", **delta}
                last = number == len(deltas) - 1
                choice = {"index": index, "delta": delta, "logprobs": logprobs if number == 0 else None,
                          "finish_reason": self._finish_reason(index, event.finish_reason) if last else None}
                yield sse(self._response([choice], None, chunk=True))
        if include_usage:
            yield sse(self._response([], self._usage(), chunk=True))
