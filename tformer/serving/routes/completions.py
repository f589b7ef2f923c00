"""POST /v1/completions: prompts (text or ids, several at once) continued, each ``n`` times, as one answer or
streamed; ``echo`` repeats each prompt before its answer, ``logprobs`` and ``prompt_logprobs`` score tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from tformer.serving.openai_api import (
    DEFAULT_COMPLETION_TOKENS,
    APIError,
    CompletionLogprobs,
    CompletionRequest,
    new_id,
    parse_body,
    response_object,
    sse,
    usage,
)
from tformer.serving.served import ServedModel
from tformer.serving.submission import Submission, stream_response
from tformer.serving.wire import TokenEvent
from tformer.tokenizers.errors import TokenizerError

TEXT_COMPLETION = "text_completion"  # the response object's kind


async def completions(served: ServedModel, http_request: HTTPRequest) -> Response:
    body: CompletionRequest = parse_body(await served.read_body(http_request), CompletionRequest)
    adapter = served.check_model(body.model)
    served.check_generates()
    served.check_admitting()
    texts = body.prompts()
    prompts = served.prompt_ids(texts, body.n)
    if body.truncate_prompt_tokens is not None:  # the text echoed is then that of the ids kept
        prompts = body.truncated(prompts)
        texts = list(prompts)
    tokens = served.token_limit(body.token_limit, prompts, DEFAULT_COMPLETION_TOKENS)
    served.check_request_tokens(prompts, body.n, tokens)
    echoes = _echoes(served, texts, prompts) if body.echo else None
    config = body.generation_config(tokens, served.engine.facts.generation_defaults)
    submission = await served.submit(http_request, prompts, config, body.n, body.logprobs, body.prompt_logprobs,
                                     adapter)
    answer = _Completion(served, submission, new_id("cmpl"), echoes, body.logprobs is not None, body.model)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return await stream_response(submission, answer.chunks(include_usage))
    try:
        return await answer.whole()
    finally:
        submission.close()


def _echoes(served: ServedModel, texts: list[str | list[int]], prompts: list[list[int]]) -> list[str]:
    """What ``echo`` repeats of each prompt: its text as sent, or the text of its ids (a 400 for an id the
    tokenizer has no text for)."""
    echoes = []
    for index, (text, ids) in enumerate(zip(texts, prompts, strict=True)):
        try:
            echoes.append(text if isinstance(text, str) else served.tokenizer.decode(ids))
        except TokenizerError as error:
            raise APIError(400, f"prompt {index}: {error}", "prompt") from None
    return echoes


class _Completion:
    """One completions answer being built from its submission's events: each choice's text and log-probabilities.
    ``echoes``: each prompt's text, when the request echoes it."""

    def __init__(self, served: ServedModel, submission: Submission, response_id: str, echoes: list[str] | None,
                 with_logprobs: bool, model: str) -> None:
        self.served = served
        self.submission = submission
        self.response_id = response_id
        self.echoes = echoes
        self.with_logprobs = with_logprobs
        self.model = model  # the name the request gave (the base model's or an adapter's)
        self.records: dict[int, CompletionLogprobs] = {}  # choice -> its log-probabilities so far

    def _response(self, choices: list[dict[str, Any]], counts: dict | None, chunk: bool = False) -> dict[str, Any]:
        return response_object(TEXT_COMPLETION, self.response_id, self.model, choices, counts, chunk=chunk)

    def _usage(self) -> dict[str, int]:
        return usage(self.submission.prompt_tokens, self.submission.completion_tokens)

    def piece(self, index: int, event: TokenEvent) -> tuple[str, int]:
        """Record ``event`` in its choice's logprobs; its text, and where its entries start in the record. A
        choice's first event starts with its prompt when the request echoes it, and with the prompt's tokens and
        their log-probabilities when the event carries them. ``index``: its choice."""
        served, submission = self.served, self.submission
        first = index not in self.records
        record = self.records.setdefault(index, CompletionLogprobs(served.tokenizer))
        start, text = len(record.tokens), event.text
        if first and self.echoes is not None:
            prompt, ids = index // submission.n, submission.prompts[index // submission.n]
            text = self.echoes[prompt] + text
            scores = event.prompt_logprobs
            if scores is None:
                record.start_answer(len(self.echoes[prompt]))
            else:
                record.add_prompt(self.echoes[prompt], ids, [served.token_text(token) for token in ids],
                                  scores.token_logprobs, [served.top_texts(top) for top in scores.top_logprobs])
        if event.token_id >= 0 and event.logprob is not None:
            record.add(event.token_id, served.token_text(event.token_id), event.logprob, served.top(event))
        return text, start

    async def whole(self) -> Response:
        choices: dict[int, dict[str, Any]] = {}
        async for index, event in self.submission.events():
            choice = choices.setdefault(index, {"text": "", "finish_reason": None})
            choice["text"] += self.piece(index, event)[0]
            if event.finish_reason is not None:
                choice["finish_reason"] = event.finish_reason
        listed = [{"index": index, "text": choice["text"],
                   "logprobs": self.records[index].since(0, len(choice["text"])) if self.with_logprobs else None,
                   "finish_reason": choice["finish_reason"]} for index, choice in sorted(choices.items())]
        self.submission.check_answered()
        return JSONResponse(self._response(listed, self._usage()))

    async def chunks(self, include_usage: bool) -> AsyncIterator[bytes]:
        async for index, event in self.submission.events():
            text, start = self.piece(index, event)
            added = self.with_logprobs and len(self.records[index].tokens) > start
            choice = {"index": index, "text": text, "logprobs": self.records[index].since(start) if added else None,
                      "finish_reason": event.finish_reason}
            yield sse(self._response([choice], None, chunk=True))
        if include_usage:
            yield sse(self._response([], self._usage(), chunk=True))
