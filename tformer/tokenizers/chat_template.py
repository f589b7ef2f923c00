"""Chat templates: the Jinja template a checkpoint's tokenizer ships (Hugging Face's
``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``) turning a list of
messages into the prompt text the model was trained on. Rendered in Jinja's sandbox, as
``transformers``' ``apply_chat_template`` does, so a template runs no arbitrary code, and within bounds:
``time_limit`` seconds of template code, ``size_limit`` characters of output and of any string or list its
``*``, ``+`` and ``**`` make, so no request's messages can make a template hang the server or fill its memory.
Templates see what ``transformers`` gives them: the tokenizer's special tokens (``bos_token``, ``eos_token``, ...),
``raise_exception``, ``strftime_now`` (Llama 3.1+ print today's date) and a ``tojson`` that escapes no HTML.
"""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tformer.errors import TformerError

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
TIME_LIMIT = 2.0  # seconds of template code per render
SIZE_LIMIT = 8_000_000  # characters of rendered prompt (and of one string or list a template builds)
TEMPLATE_CODE = "<template>"  # the file name of Jinja's code compiled from a string


class ChatTemplateError(TformerError):
    """A chat template that cannot be read or rendered, or messages it refuses."""


class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None, *,
                 time_limit: float = TIME_LIMIT, size_limit: int = SIZE_LIMIT) -> None:
        import jinja2
        import jinja2.meta

        environment = _bounded_sandbox(size_limit)(trim_blocks=True, lstrip_blocks=True,
                                                   extensions=["jinja2.ext.loopcontrols"])
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = _strftime_now
        environment.filters["tojson"] = _tojson
        self.time_limit = time_limit
        self.size_limit = size_limit
        try:
            self.template = environment.from_string(source)
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"the chat template does not compile: {error}") from None
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        # Whether the template lists functions itself (Qwen2.5, Llama 3.1+, Mistral read ``tools``).
        self.reads_tools = "tools" in jinja2.meta.find_undeclared_variables(environment.parse(source))

    @classmethod
    def from_file(cls, path: str | Path) -> ChatTemplate:
        return cls(Path(path).read_text(encoding="utf-8"))

    @classmethod
    def from_folder(cls, folder: str | Path) -> ChatTemplate | None:
        """The template a checkpoint folder ships, or None: ``chat_template.jinja`` first, then the
        ``chat_template`` of ``tokenizer_config.json`` (a string, or named templates: "default")."""
        folder = Path(folder)
        config = _read_json(folder / TOKENIZER_CONFIG)
        special = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
        special = {name: text for name, text in special.items() if text is not None}
        if (folder / TEMPLATE_FILE).is_file():
            return cls((folder / TEMPLATE_FILE).read_text(encoding="utf-8"), special)
        template = config.get("chat_template")
        if isinstance(template, list):
            named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
            template = named.get("default")
        if isinstance(template, str) and template:
            return cls(template, special)
        return None

    def end_token_ids(self, tokenizer: Any) -> tuple[int, ...]:
        """The id of the token that ends the assistant's turn: tokenizer_config.json's ``eos_token`` (Qwen2.5
        Instruct's ``<|im_end|>``, Llama 3 Instruct's ``<|eot_id|>``), a stop beside the model's end ids as vLLM
        adds it; () when the template came without one. A ChatTemplateError when ``tokenizer`` has no such token
        (every answer would run to its length)."""
        end = self.special_tokens.get("eos_token")
        if end is None:
            return ()
        end_id = tokenizer.token_to_id(end)
        if end_id is None:
            raise ChatTemplateError(f"{TOKENIZER_CONFIG}'s eos_token {end!r} (where a chat turn ends) is not a token "
                                    "of the tokenizer")
        return (end_id,)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for ``messages``, ending with the assistant's turn opened; ``tools`` (OpenAI's function
        objects) given to a template that ``reads_tools``. A ChatTemplateError for whatever the template raises (an
        error of its own, ``range`` past the sandbox's limit, a type error) and for running past ``time_limit`` or
        ``size_limit``."""
        extra = {"tools": tools} if tools is not None else {}
        pieces, size = [], 0
        deadline = _Deadline(self.time_limit)
        previous = sys.gettrace()
        sys.settrace(deadline)  # this thread only; template code is checked line by line
        try:
            for piece in self.template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **extra, **self.special_tokens):
                size += len(piece)
                if size > self.size_limit:
                    raise ChatTemplateError(f"the chat template's output passed {self.size_limit:,} characters")
                pieces.append(piece)
        except ChatTemplateError:
            raise
        except Exception as error:  # any error of the template's code is the template failing
            raise ChatTemplateError(f"the chat template failed on these messages: {type(error).__name__}: "
                                    f"{error}") from None
        finally:
            sys.settrace(previous)
        return "".join(pieces)


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(pattern: str) -> str:
    """The local time as ``pattern`` says (transformers' ``strftime_now``: Llama 3.1+ templates date the prompt)."""
    return datetime.now().strftime(pattern)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: tuple | None = None,
            sort_keys: bool = False) -> str:
    """JSON as transformers' templates get it: Jinja's own ``tojson`` escapes ``<``, ``>``, ``&`` and ``'`` for HTML
    and sorts keys, which would change a tool's schema in the prompt."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Deadline:
    """A trace function that ends a render past its time: line events in template code only."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def __call__(self, frame, event: str, arg: object):
        return self._line if frame.f_code.co_filename == TEMPLATE_CODE else None

    def _line(self, frame, event: str, arg: object):
        if time.monotonic() > self.end:
            raise ChatTemplateError(f"the chat template ran for more than {self.seconds:g} s")
        return self._line


def _bounded_sandbox(size_limit: int):
    """Jinja's immutable sandbox whose ``*``, ``+`` and ``**`` refuse results past ``size_limit`` (a string,
    list or number a single operation could make gigabytes of)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "+", "**"])

        def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
            if _binop_size(operator, left, right) > size_limit:
                raise ChatTemplateError(f"the chat template built a value past {size_limit:,} characters or items "
                                        f"with {operator!r}")
            return super().call_binop(context, operator, left, right)

    return BoundedSandbox


def _binop_size(operator: str, left: Any, right: Any) -> float:
    """The size of ``left operator right``'s result before computing it: a sequence's length, a number's
    digits."""
    sized = (str, list, tuple)
    if operator == "*":
        if isinstance(left, sized) and isinstance(right, int):
            return len(left) * right
        if isinstance(right, sized) and isinstance(left, int):
            return len(right) * left
    elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        return len(left) + len(right)
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        return right * math.log10(abs(left))
    return 0


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ChatTemplateError(f"{path}: not valid JSON ({error})") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
