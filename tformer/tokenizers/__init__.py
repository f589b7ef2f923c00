"""Tokenizers and the one loader for their files."""

from __future__ import annotations

import json
from pathlib import Path

from tformer.errors import TformerError
from tformer.tokenizers.char import CharTokenizer


class TokenizerError(TformerError):
    """A tokenizer file is missing, unreadable or of an unknown kind."""


def load(path: str | Path):
    """Load a tokenizer from a ``tokenizer.json`` file or a folder holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{path}: no tokenizer file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise TokenizerError(f"{path}: not a readable tokenizer.json ({error})") from None
    kind = data.get("model", {}).get("type") if isinstance(data, dict) else None
    if kind == "Char":
        return CharTokenizer.from_dict(data)
    raise TokenizerError(f"{path}: unknown tokenizer model type {kind!r}; known: Char")


__all__ = ["CharTokenizer", "TokenizerError", "load"]
