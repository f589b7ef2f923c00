"""Chat templates: the Jinja template a checkpoint's tokenizer ships (Hugging Face's
``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``) turning a list of
messages into the prompt text the model was trained on. Rendered in Jinja's sandbox, as
``transformers``' ``apply_chat_template`` does, so a template runs no arbitrary code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tformer.errors import TformerError

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"


class ChatTemplateError(TformerError):
    """A chat template that cannot be read or rendered, or messages it refuses."""


class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=["jinja2.ext.loopcontrols"])
        environment.globals["raise_exception"] = _raise
        try:
            self.template = environment.from_string(source)
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"the chat template does not compile: {error}") from None
        self.source = source
        self.special_tokens = dict(special_tokens or {})

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

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages``, ending with the assistant's turn opened."""
        import jinja2

        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        **self.special_tokens)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"the chat template failed on these messages: {error}") from None


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


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
