"""What every route of the server reads: the engine client and its tokenizer, the served model's name (and its LoRA
adapters', which a request's ``model`` names instead to decode with one) and chat template, the request limits,
the requests in flight, and the checks and conversions the routes share, among them ``submit``, the one path
from a route's prompts to the engine's events (a ``Submission``).

Limits: a body past ``max_body_bytes`` is refused (413) before it is read whole, more than ``max_prompts``
prompts (400) before any is tokenized, and more than ``max_request_tokens`` tokens of prompts and answers
(400) as soon as the prompts tokenized so far pass it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from starlette.requests import Request as HTTPRequest

from tformer.generation.settings import GenerationConfig, GenerationError
from tformer.generation.sources import encode_sources, translation_budget
from tformer.serving.engine_client import EngineClient
from tformer.serving.inflight import InFlight
from tformer.serving.limits import DEFAULT_CACHE_TOKENS, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPTS
from tformer.serving.openai_api import APIError, ChatMessage
from tformer.serving.submission import Submission
from tformer.serving.tool_calls import ToolRequest, template_messages
from tformer.serving.wire import TokenEvent
from tformer.tokenizers.chat_template import ChatTemplate, ChatTemplateError

DEFAULT_CHAT_TOKENS = 256  # a chat answer's length when the request sets none and the model has no position limit


class ServedModel:
    """One model served over one engine, as the routes see it (``server.OpenAIServer`` adds the HTTP app)."""

    def __init__(self, engine: EngineClient, model_name: str, *, api_key: str | None = None,
                 chat_template: ChatTemplate | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_prompts: int = DEFAULT_MAX_PROMPTS, max_request_tokens: int | None = None) -> None:
        """``max_request_tokens``: prompt and answer tokens of all of a request's sequences together (default:
        the cache's size, what the engine could ever hold at once)."""
        if engine.tokenizer is None:
            raise GenerationError("the server needs the model's tokenizer (text in, text out)")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        if model_name in engine.facts.adapters:
            raise GenerationError(f"adapter name {model_name!r} is the base model's name; give the adapter another")
        self.api_key = api_key
        self.chat_template = chat_template
        # A chat answer stops at the model's end ids and at the template's end of turn (tokenizer_config.json's
        # eos_token), which a folder's generation_config.json may not list.
        turn_ends = () if chat_template is None else chat_template.end_token_ids(self.tokenizer)
        self.chat_end_ids = tuple(dict.fromkeys((*engine.facts.end_token_ids, *turn_ends)))
        self.max_prompts = max_prompts
        cache = engine.facts.num_blocks * engine.facts.block_size  # none when the model embeds only
        self.max_request_tokens = (max_request_tokens if max_request_tokens is not None
                                   else cache or DEFAULT_CACHE_TOKENS)
        self.flight = InFlight(engine, max_body_bytes)
        self.responses: Counter[int] = Counter()  # HTTP status -> count, for /metrics
        self.created = int(time.time())

    async def read_body(self, http_request: HTTPRequest) -> bytes:
        return await self.flight.read_body(http_request)

    async def submit(self, http_request: HTTPRequest, prompts: list[list[int]], config: GenerationConfig, n: int,
                     logprobs: int | None, prompt_logprobs: int | None = None,
                     adapter: str | None = None) -> Submission:
        """``prompts`` (``n`` sequences each) submitted to the engine for ``http_request``, decoded with the LoRA
        ``adapter`` (None: the base model): their events are read from the submission, which the caller closes when
        the answer is over."""
        submission = Submission(self.flight, http_request)
        await submission.submit(prompts, config, n, logprobs, prompt_logprobs, adapter)
        return submission

    # ---- checks -------------------------------------------------------------------------------------

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names a request's ``model`` may give: the base model's, then each served adapter's."""
        return (self.model_name, *self.engine.facts.adapters)

    def check_model(self, name: str) -> str | None:
        """The LoRA adapter a request's ``model`` names (None: the base model); a 404 naming the models served."""
        if name == self.model_name:
            return None
        if name in self.engine.facts.adapters:
            return name
        served = ", ".join(repr(known) for known in self.model_names)
        raise APIError(404, f"model {name!r} does not exist; this server serves {served}", "model", "model_not_found")

    def check_admitting(self) -> None:
        self.flight.check_admitting()

    def check_generates(self) -> None:
        """A 400 on a generation route when the model embeds only (an encoder)."""
        if not self.engine.facts.generates:
            raise APIError(400, f"model {self.model_name!r}: {self.engine.facts.embeds_only} (POST /v1/embeddings)",
                           "model", "embeddings_only")

    def check_reads_text(self, field: str) -> None:
        """A 400 naming the route a speech model serves, when a route gives the model text."""
        if self.engine.facts.audio is not None:
            raise APIError(400, f"model {self.model_name!r} is a speech model: it transcribes recordings "
                                "(POST /v1/audio/transcriptions), not text", field, "not_a_text_model")

    def prompt_ids(self, prompts: list[str | list[int]], n: int, field: str = "prompt") -> list[list[int]]:
        """Each prompt's ids (``field``: the request field that holds them, for messages); a 400 past
        ``max_prompts`` before any is tokenized, and as soon as the prompts so far pass ``max_request_tokens``."""
        if len(prompts) > self.max_prompts:
            raise APIError(400, f"{len(prompts):,} {field}s in one request; at most {self.max_prompts} "
                                "(the server's --max-prompts)", field)
        every: list[list[int]] = []
        facts = self.engine.facts
        self.check_reads_text(field)
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                ids = list(prompt)
            elif facts.encodes_prompt:  # a source, as ``tformer translate`` reads it
                (ids,) = encode_sources(self.tokenizer, [prompt], facts.source_end_id)
            else:
                ids = self.tokenizer.encode(prompt)
            if not ids:
                raise APIError(400, f"{field} {index} has no tokens", field)
            every.append(ids)
            self.check_request_tokens(every, n, 0, field)
        return every

    def check_request_tokens(self, prompts: list[list[int]], n: int, new_tokens: int, field: str = "prompt") -> None:
        """A 400 when ``n`` sequences of each prompt, prompt and ``new_tokens`` together, pass
        ``max_request_tokens``."""
        total = n * sum(len(prompt) + new_tokens for prompt in prompts)
        if total <= self.max_request_tokens:
            return
        counted = (f"more than {total:,} tokens ({len(prompts)} {field}(s) so far)" if field != "prompt" else
                   f"{'more than ' if not new_tokens else ''}{total:,} tokens (n={n} x {len(prompts)} prompt(s) x "
                   "(prompt + max_tokens))")
        raise APIError(400, f"the request needs {counted}; at most {self.max_request_tokens:,} per request (the "
                            "server's --max-request-tokens)", "max_tokens" if new_tokens else field,
                       "request_too_large")

    def token_limit(self, requested: int | None, prompts: list[list[int]], route_default: int | None) -> int:
        """A request's new tokens at most: ``requested`` (its max_tokens), else the folder's generation_config.json
        length (``max_new_tokens``, or what its ``max_length`` leaves after the longest prompt, as Hugging Face
        counts it) within the room the context leaves, else ``route_default`` (None: that room); an encoder-decoder's
        decoder prompt is its start token, and its default is ``tformer translate``'s budget for the longest source."""
        if requested is not None:
            return requested
        facts = self.engine.facts
        longest = max(len(prompt) for prompt in prompts)
        limit = facts.position_limit
        if facts.encodes_prompt:  # the decoder starts from one token, and a translation's room follows its source
            longest, route_default = 1, translation_budget(longest, limit)
        room = None if limit is None else max(1, limit - longest)
        defaults, length = facts.generation_defaults, None
        if defaults is not None and defaults.max_length is not None:
            if defaults.max_length <= longest:
                raise APIError(400, f"the model's generation_config.json max_length={defaults.max_length} leaves no "
                                    f"new token after a {longest}-token prompt; send max_tokens", "max_tokens")
            length = defaults.max_length - longest
        elif defaults is not None and defaults.max_new_tokens != GenerationConfig().max_new_tokens:
            length = defaults.max_new_tokens
        if length is not None:
            return length if room is None else min(length, room)
        if route_default is not None:
            return route_default
        return DEFAULT_CHAT_TOKENS if room is None else room

    # ---- text ---------------------------------------------------------------------------------------

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def top(self, event: TokenEvent) -> list[tuple[str, float]]:
        """The event's alternatives as (text, log-probability)."""
        return self.top_texts(event.top_logprobs or [])

    def top_texts(self, top: list[tuple[int, float]]) -> list[tuple[str, float]]:
        return [(self.token_text(token), value) for token, value in top]

    async def chat_text(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                        tools: ToolRequest | None = None) -> str:
        """``messages`` rendered by the chat template, with the functions of ``tools`` offered to the model (through
        the template's own ``tools`` where it reads them, else ``tool_calls.DEFAULT_TOOL_PROMPT``), on a worker
        thread (a slow template, bounded by its time limit, holds no other request); a 400 without a template or
        when it fails."""
        self.check_reads_text("messages")
        if self.engine.facts.encodes_prompt:
            raise APIError(400, f"model {self.model_name!r} is an encoder-decoder: it writes what its source says, in "
                                "another language or task, not a chat's next turn; send the source to "
                                "POST /v1/completions as the prompt", "messages", "not_a_chat_model")
        if self.chat_template is None:
            raise APIError(400, f"model {self.model_name!r} has no chat template (the checkpoint's tokenizer ships "
                                "none; start the server with --chat-template FILE, or use /v1/completions)",
                           "messages", "no_chat_template")
        template = self.chat_template
        rendered = template_messages([message.as_template_input() for message in messages], tools,
                                     template.reads_tools)
        offered = [tool.as_template_input() for tool in tools.tools] if tools is not None and template.reads_tools \
            else None
        try:
            return await asyncio.to_thread(template.render, rendered, add_generation_prompt, offered)
        except ChatTemplateError as error:
            raise APIError(400, str(error), "messages") from None
