"""The OpenAI wire format: request bodies checked field by field, turned into ``GenerationConfig``s,
and the response, stream-chunk and error objects the ``openai`` client reads; the bodies of the tokenizer
routes vLLM made common (``/tokenize``, ``/detokenize``).

Failing closed: a field of OpenAI's API or of vLLM's extensions the server cannot honour (``suffix``, ``best_of``
other than ``n``, ``use_beam_search``, ...: ``REFUSED_FIELDS`` says why for each) is refused with 400 naming it,
and so is an unknown field; a field of the wrong type is 422, nothing coerced (``"10"`` is not a number, ``true``
not 1, ``"yes"`` not a boolean; an integer is a float). OpenAI's ``logit_bias``, ``presence_penalty`` and
``frequency_penalty`` are honoured, and the extensions vLLM made common: ``top_k``, ``ignore_eos``,
``min_tokens``, ``stop_token_ids``, ``allowed_token_ids``, and the options whose ``GenerationConfig`` field
declares a request field taken as it is (``min_p``, ``repetition_penalty``, the penalties). A field a request
leaves out takes the value the model folder's generation_config.json gives it, else OpenAI's default.

Structured outputs: OpenAI's ``response_format`` (``json_object``, ``json_schema``), vLLM's ``structured_outputs``
object (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``) and its older ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``, on completions and chat alike, become the request's
``GenerationConfig.constraint``; a schema, regex or grammar the grammar engine cannot compile is a 400 naming the
field.
"""

from __future__ import annotations

import dataclasses
import json
import time
import typing
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from tformer.errors import TformerError
from tformer.generation.constraints import Constraint
from tformer.generation.detokenize import IncrementalDetokenizer
from tformer.generation.settings import GenerationConfig, GenerationError, declared
from tformer.serving.refused_fields import REFUSED_FIELDS

# GenerationConfig's names -> the request fields that set them (each field's ``api``), so an error names the field
# sent; and the options a request field sets as it is (``api_as_is``: vLLM's min_p, repetition_penalty).
FIELD_OF_OPTION = {name: option.api for name, option in declared().items() if option.api is not None}
AS_IS = {name: option.api for name, option in declared().items() if option.api is not None and option.api_as_is}
SAMPLING_FIELDS = frozenset(option.api for option in declared().values() if option.api is not None and option.sampling)


class APIError(TformerError):
    """An error answered as OpenAI's error object with an HTTP status."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
             500: "server_error", 503: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


DEFAULT_COMPLETION_TOKENS = 16  # a completion's max_tokens when neither the request nor the folder sets one (OpenAI's)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # strict: no "10" -> 10, true -> 1, "yes" -> true


class StreamOptions(_Strict):
    include_usage: bool = False


class JSONSchemaFormat(_Strict):
    """``response_format``'s ``json_schema`` object, as OpenAI defines it: the schema is enforced whether or not
    ``strict`` is set (the grammar engine never writes text outside it)."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's ``response_format``: free text, any JSON object, or JSON valid under a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs`` object: one of ``json`` (a schema, or its JSON text), ``regex``, ``choice``,
    ``grammar`` (Lark, or GBNF) or ``json_object`` (true)."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class _OpenAISampling(_Strict):
    """The fields completions and chat completions share, as OpenAI defines them (``_Sampling`` adds the options
    a request sets as they are)."""

    model: str
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = None  # extension; None, 0 or -1: no cut
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Structured outputs (one at most): OpenAI's response_format, vLLM's structured_outputs object and its older
    # guided_* fields; each becomes the GenerationConfig's constraint (``constraint``).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    logit_bias: dict[str, float] | None = None  # token id (a decimal string, as JSON keys are) -> bias in [-100, 100]
    user: str | None = None  # an end-user id for the operator's logs; nothing to honour
    safety_identifier: str | None = None  # OpenAI's successor to user: an id, nothing to honour
    ignore_eos: bool = False  # extension: never stop at the end token
    min_tokens: int = Field(0, ge=0)  # extension: the end token is forbidden before this many
    stop_token_ids: list[int] | None = None  # extension: these ids end a sequence too (ignore_eos keeps them)
    allowed_token_ids: list[int] | None = None  # extension: the only ids that may be chosen
    truncate_prompt_tokens: int | None = Field(None, ge=1)  # extension: only a prompt's last this many tokens run

    def truncated(self, prompts: list[list[int]]) -> list[list[int]]:
        """Each prompt's last ``truncate_prompt_tokens`` ids (all of them when it is not set), as vLLM keeps them."""
        keep = self.truncate_prompt_tokens
        return prompts if keep is None else [prompt[-keep:] for prompt in prompts]

    def unsupported(self) -> None:
        """Refuse the fields a value of which this server cannot honour."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options needs stream=true", "stream_options")

    def generation_config(self, max_new_tokens: int, defaults: GenerationConfig | None = None) -> GenerationConfig:
        """The engine's options for these fields, each field the request leaves out taken from ``defaults`` (the
        folder's generation_config.json) where that sets it; a GenerationError re-worded as the field's 400."""
        top_k = None if self.top_k in (None, 0, -1) else self.top_k
        try:
            config = GenerationConfig(
                max_new_tokens=max_new_tokens, min_new_tokens=self.min_tokens, do_sample=self.temperature > 0,
                temperature=self.temperature, top_k=top_k, top_p=None if self.top_p == 1 else self.top_p,
                seed=self.seed, stop_strings=() if self.stop is None else self.stop,
                eos_token_id=() if self.ignore_eos else None, logit_bias=self._logit_bias(),
                stop_token_ids=self.stop_token_ids or (), allowed_token_ids=self.allowed_token_ids,
                constraint=self.constraint(),
                **{name: getattr(self, field) for name, field in AS_IS.items()},
            )
            return config.replace(**self._left_to(defaults)) if defaults is not None else config
        except GenerationError as error:
            raise as_api_error(error) from None

    def _logit_bias(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias``'s keys (JSON object keys: strings) as token ids; a 400 naming the field for a key that is
        not a decimal integer (the values and the ids' range are checked as options)."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise APIError(400, f"logit_bias: key {key!r} is not a token id (a decimal integer such as \"50256\")",
                               "logit_bias")
            pairs.append((int(key), bias))
        return tuple(pairs)

    def constraint(self) -> Constraint | None:
        """The constraint the structured-output fields ask for (None: free text); a 400 naming the field for two of
        them, or for a schema, regex or grammar that does not compile."""
        asked = []  # (request field, make the Constraint)
        response_format = self.response_format
        if response_format is not None and response_format.type == "json_object":
            asked.append(("response_format", Constraint.json_object))
        elif response_format is not None and response_format.type == "json_schema":
            given = response_format.json_schema
            if given is None or given.schema_ is None:
                raise APIError(400, "response_format of type 'json_schema' needs json_schema.schema (the JSON Schema)",
                               "response_format")
            asked.append(("response_format", lambda: Constraint.json_schema(given.schema_)))
        outputs = self.structured_outputs
        if outputs is not None:
            kinds = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                     if getattr(outputs, "json_" if name == "json" else name) not in (None, False)]
            if len(kinds) != 1:
                raise APIError(400, "structured_outputs must give exactly one of json, regex, choice, grammar, "
                                    f"json_object (got {', '.join(kinds) or 'none'})", "structured_outputs")
            asked.append(("structured_outputs", _maker(kinds[0], getattr(outputs, "json_" if kinds[0] == "json"
                                                                         else kinds[0]))))
        for kind in ("json", "regex", "choice", "grammar"):
            value = getattr(self, f"guided_{kind}")
            if value is not None:
                asked.append((f"guided_{kind}", _maker(kind, value)))
        if len(asked) > 1:
            raise APIError(400, f"{' and '.join(field for field, _ in asked)} each constrain the output: give one of "
                                "them", asked[1][0])
        if not asked:
            return None
        field, make = asked[0]
        try:
            return make()
        except GenerationError as error:
            raise APIError(400, f"{field}: {error}", field) from None

    def _left_to(self, defaults: GenerationConfig) -> dict[str, Any]:
        """The options of the fields this request left out that ``defaults`` sets (away from tformer's default), as
        Hugging Face's generate and vLLM take a folder's sampling settings. Its ``do_sample`` decides whether a
        request that sends no sampling field samples, as in Hugging Face (false: greedy; true: at the file's
        temperature, which is read only then; a sampling field sent samples, as ``tformer generate``'s flags do);
        the length is the route's (``ServedModel.token_limit``)."""
        sent, base = self.model_fields_set, GenerationConfig()
        taken = {name: getattr(defaults, name) for name, field in FIELD_OF_OPTION.items()
                 if field not in sent and name != "max_new_tokens" and getattr(defaults, name) != getattr(base, name)}
        if not sent & SAMPLING_FIELDS and defaults.do_sample is not None:
            taken["do_sample"] = defaults.do_sample
        return taken


def _maker(kind: str, value: Any):
    """What makes the constraint of vLLM's ``kind`` ("json", "regex", "choice", "grammar", "json_object") from a
    request's ``value`` (a json schema may come as its JSON text)."""
    if kind == "json":
        def json_schema() -> Constraint:
            schema = value
            if isinstance(value, str):
                try:
                    schema = json.loads(value)
                except json.JSONDecodeError as error:
                    raise GenerationError(f"json_schema is not JSON: {error}") from None
            return Constraint.json_schema(schema)
        return json_schema
    if kind == "json_object":
        return Constraint.json_object
    return lambda: getattr(Constraint, kind)(value)


def _as_is_fields() -> dict[str, Any]:
    """The request fields of the options a request sets as they are: the option's type and default."""
    hints = typing.get_type_hints(GenerationConfig)
    defaults = {field.name: field.default for field in dataclasses.fields(GenerationConfig)}
    return {field: (hints[name], defaults[name]) for name, field in AS_IS.items()}


_Sampling = create_model("_Sampling", __base__=_OpenAISampling, __doc__=_OpenAISampling.__doc__, **_as_is_fields())


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)  # None (omitted or null): the default (see token_limit); 0: score only
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False  # the prompt before the answer, in the text and (with logprobs) in the logprobs
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.max_tokens == 0 and not (self.echo and self.logprobs is not None):
            raise APIError(400, "max_tokens=0 only scores the prompt: it needs echo=true and logprobs", "max_tokens")
        if self.suffix:
            raise APIError(400, "suffix (insertion) is not supported", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise APIError(400, f"best_of={self.best_of} is not supported (only best_of = n)", "best_of")

    def prompts(self) -> list[str | list[int]]:
        """The prompts: one text, one list of ids, or a list of either."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        if not prompt:
            raise APIError(400, "prompt is empty", "prompt")
        return list(prompt)

    @property
    def token_limit(self) -> int | None:
        """``max_tokens``; None: the default (``ServedModel.token_limit``)."""
        return self.max_tokens

    @property
    def prompt_logprobs(self) -> int | None:
        """How many alternatives each prompt token's entry lists; None: the prompt is not scored."""
        return self.logprobs if self.echo else None


class ContentPart(_Strict):
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # templates may read fields such as "name"
    role: str
    content: str | list[ContentPart] | None = None

    def as_template_input(self) -> dict[str, Any]:
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            kinds = {part.type for part in self.content} - {"text"}
            if kinds:
                raise APIError(400, f"content parts of type {', '.join(sorted(kinds))} are not supported (only text)",
                               "messages")
            message["content"] = "".join(part.text or "" for part in self.content)
        return message


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # None (omitted or null): the rest of the context
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None  # checked by tool_calls.read_tools (the route's first step)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True  # extension: the template's opening of the assistant's turn after the messages
    continue_final_message: bool = False  # extension: the answer continues the last message (its end left open)

    def unsupported(self) -> None:
        super().unsupported()
        if self.continue_final_message and self.add_generation_prompt and "add_generation_prompt" in \
                self.model_fields_set:
            raise APIError(400, "continue_final_message continues the last message, add_generation_prompt=true opens a "
                                "new turn: send one of them", "continue_final_message")
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def opens_turn(self) -> bool:
        """Whether the template opens the assistant's turn after the messages (not when continuing the last one)."""
        return self.add_generation_prompt and not self.continue_final_message

    def continued(self, text: str) -> str:
        """``text`` (the rendered messages) cut after the final message's content when ``continue_final_message``,
        what the template closes the message with left out, so the answer continues it (transformers'
        apply_chat_template(continue_final_message=True) cuts the same place: after the content's last occurrence,
        its trailing spaces kept where the template kept them); a 400 when the content is not in the text."""
        if not self.continue_final_message:
            return text
        content = self.messages[-1].as_template_input().get("content") or ""
        if not content.strip() or content.strip() not in text:
            raise APIError(400, "continue_final_message: the final message's content does not appear in the "
                                "rendered chat (the template drops or changes it), so it cannot be continued",
                           "continue_final_message")
        start = text.rindex(content.strip())
        kept = content.lstrip() if text[start:].startswith(content.lstrip()) else content.strip()
        return text[: start + len(kept)]


class EmbeddingRequest(_Strict):
    """POST /v1/embeddings, as OpenAI defines it: ``input`` a text, texts, token ids or lists of them."""

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None  # an end-user id for the operator's logs; nothing to honour

    def unsupported(self) -> None:
        pass  # dimensions: the route knows whether the model can (ServedModel's embedding facts)

    def inputs(self) -> list[str | list[int]]:
        """The inputs, each a text or a list of ids; a 400 for none, or for an empty one."""
        given = self.input
        inputs = [given] if isinstance(given, str) or (given and isinstance(given[0], int)) else list(given)
        if not inputs:
            raise APIError(400, "input is empty: give a text, texts, token ids or lists of token ids", "input")
        empty = next((index for index, item in enumerate(inputs) if len(item) == 0), None)
        if empty is not None:
            raise APIError(400, f"input {empty} is empty", "input")
        return inputs


class TokenizeRequest(_Strict):
    """POST /tokenize: a prompt's ids as /v1/completions prefills them, or the ids of ``messages`` rendered by
    the chat template as /v1/chat/completions prefills them."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # None: as the completion routes (a prompt: true, messages: false)
    add_generation_prompt: bool | None = None  # messages only; None: true, as chat completions

    def unsupported(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", "prompt" if self.prompt else "messages")
        if self.prompt is not None and self.add_generation_prompt is not None:
            raise APIError(400, "add_generation_prompt applies to messages, not to a prompt", "add_generation_prompt")

    @property
    def special_tokens(self) -> bool:
        return self.add_special_tokens if self.add_special_tokens is not None else self.prompt is not None


class DetokenizeRequest(_Strict):
    """POST /detokenize: the text of token ids."""

    model: str | None = None
    tokens: list[int]

    def unsupported(self) -> None:
        pass


def parse_body(raw: bytes, schema: type[BaseModel]) -> Any:
    """The request body as ``schema``: 400 for text that is not a JSON object or for unknown fields,
    422 for a field of the wrong type or out of range, each naming the field."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise APIError(400, f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise APIError(400, "the body nests arrays or objects too deeply to parse") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, not {type(data).__name__}")
    return validate_request(data, schema)


def validate_request(data: dict[str, Any], schema: type[BaseModel]) -> Any:
    """A request's fields as ``schema`` (errors as ``parse_body``'s), its unsupported values refused."""
    try:
        request = schema.model_validate(data)
    except ValidationError as error:
        raise _validation_error(error, schema) from None
    request.unsupported()
    return request


def _validation_error(error: ValidationError, schema: type[BaseModel]) -> APIError:
    errors = error.errors()
    first = errors[0]
    location = list(first["loc"])
    member = next((index for index, part in enumerate(location) if _is_union_member(part)), None)
    if member is not None:  # a union: one error per member ("prompt.list[int].0"); name the field and its types
        field_path = location[:member]
        param = ".".join(str(part) for part in field_path)
        types = dict.fromkeys(str(e["loc"][member]) for e in errors
                              if len(e["loc"]) > member and list(e["loc"][:member]) == field_path)
        whole = next((e["input"] for e in errors if list(e["loc"]) == [*field_path, location[member]]), first["input"])
        return APIError(422, f"{param}: must be one of {', '.join(types)} (got {_shown(whole)})", param)
    param = ".".join(str(part) for part in location)
    if first["type"] == "extra_forbidden":
        if len(location) == 1 and param in REFUSED_FIELDS and issubclass(schema, _OpenAISampling):
            return APIError(400, f"{param} is not supported: {REFUSED_FIELDS[param]}", param)
        known = ", ".join(sorted(schema.model_fields))
        return APIError(400, f"unknown field {param!r}; known fields: {known}", param)
    if first["type"] == "missing":
        return APIError(422, f"{param} is required", param)
    return APIError(422, f"{param}: {first['msg']} (got {_shown(first.get('input'))})", param)


def _is_union_member(part: str | int) -> bool:
    """Whether a location part is a union member's tag ("str", "list[int]", "function-after[...]")."""
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "none"})


def _shown(value: Any) -> str:
    return json.dumps(value)[:80]


def as_api_error(error: GenerationError) -> APIError:
    """A GenerationError as 400, the engine's option names replaced by the request fields that set them."""
    message, param = str(error), None
    for option, field in FIELD_OF_OPTION.items():
        if option in message:
            message = message.replace(option, field)
            param = param or field
    return APIError(400, message, param)


# ---- responses ----------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_object(kind: str, response_id: str, model: str, choices: list[dict], usage_counts: dict | None,
                    chunk: bool = False) -> dict[str, Any]:
    """A response or stream chunk of ``kind`` ("text_completion" or "chat.completion"; a chat chunk's kind
    is "chat.completion.chunk"); ``usage`` always in a whole response, in a chunk only when given."""
    name = f"{kind}.chunk" if chunk and kind == "chat.completion" else kind
    body = {"id": response_id, "object": name, "created": int(time.time()), "model": model, "choices": choices}
    if usage_counts is not None or not chunk:
        body["usage"] = usage_counts
    return body


class TextOffsets:
    """Where each of a run of tokens starts in the text they decode to, in characters (code points), read one
    token at a time: the length of the text the tokens before it decode to, up to the last boundary between two
    tokens that is also one between characters. A character split across byte-level tokens is not text yet
    after its first bytes, so a token that ends inside a character and the tokens after it up to the one that
    completes it share the offset where the first of them starts (vLLM's echoed offsets, sums of its
    incrementally decoded token texts, hold such a character back the same way). Hence ``text[offset_i:offset_j]`` is
    the text of tokens i..j-1 wherever both boundaries fall between characters, the offsets never decrease,
    and none passes the text."""

    def __init__(self, tokenizer, start: int = 0) -> None:
        self.start = start  # where the run's text begins in the choice's text
        self._text = IncrementalDetokenizer(tokenizer)  # no stop strings: holds back split characters only

    def next(self, token_id: int) -> int:
        """The offset of the run's next token, ``token_id``."""
        offset = self.start + len(self._text.text)
        self._text.add([token_id])
        return offset


class CompletionLogprobs:
    """The legacy completions ``logprobs`` object, grown one token at a time: with ``echo``, the prompt's tokens
    first (the first one has no log-probability: null, as OpenAI's), then the answer's. ``text_offset`` is each
    token's character offset in the choice's text, by ``TextOffsets``' rule (the prompt's tokens from the
    text's start, the answer's from the echoed prompt's end)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []
        self.offsets = TextOffsets(tokenizer)

    def add(self, token_id: int, token: str, logprob: float | None, top: list[tuple[str, float]] | None) -> None:
        """Record one token: its id and its text (``token``)."""
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(None if top is None else dict(top))
        self.text_offset.append(self.offsets.next(token_id))

    def add_prompt(self, text: str, token_ids: list[int], tokens: list[str], logprobs: list[float],
                   tops: list[list[tuple[str, float]]]) -> None:
        """Record an echoed prompt: its ``text``, its ids and their texts (``tokens``), all but the first scored
        (``logprobs``, ``tops``). A text prompt is echoed as sent, so where its tokens decode to more text than
        it holds (a tokenizer that does not give its text back) their offsets stop at its end."""
        first = len(self.text_offset)
        for token_id, token, logprob, top in zip(token_ids, tokens, [None, *logprobs], [None, *tops], strict=True):
            self.add(token_id, token, logprob, top)
        self.text_offset[first:] = [min(offset, len(text)) for offset in self.text_offset[first:]]
        self.start_answer(len(text))

    def start_answer(self, start: int) -> None:
        """The answer's tokens follow from character ``start`` of the choice's text (the echoed prompt's end)."""
        self.offsets = TextOffsets(self.tokenizer, start)

    def since(self, start: int, text_length: int | None = None) -> dict[str, list]:
        """The object for the tokens recorded from ``start`` on (a stream chunk's; 0: the whole answer's). Given
        the choice's whole ``text_length``, no offset passes it (the tokens of a stop string, cut from the text)."""
        offsets = self.text_offset[start:]
        if text_length is not None:
            offsets = [min(offset, text_length) for offset in offsets]
        return {"tokens": self.tokens[start:], "token_logprobs": self.token_logprobs[start:],
                "top_logprobs": self.top_logprobs[start:], "text_offset": offsets}


def chat_logprob_entry(token: str, logprob: float, top: list[tuple[str, float]]) -> dict[str, Any]:
    """One token of a chat ``logprobs.content`` list."""
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")),
            "top_logprobs": [{"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}
                             for text, value in top]}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
