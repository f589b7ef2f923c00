"""A character-level tokenizer: one id per distinct character of the training text."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

UNK = "<unk>"


class CharTokenizer:
    """Maps each character seen in training to an id; unseen characters map to ``<unk>`` (id 0)."""

    kind = "char"

    def __init__(self, characters: Iterable[str]) -> None:
        chars = [c for c in dict.fromkeys(characters) if c != UNK]
        self.id_to_token = [UNK, *chars]
        self.token_to_id = {token: index for index, token in enumerate(self.id_to_token)}
        self.unk_token_id = 0

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """A vocabulary of the distinct characters of ``text``, in sorted order."""
        if not text:
            raise ValueError("cannot train a character tokenizer on empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.id_to_token)

    def encode(self, text: str) -> list[int]:
        lookup = self.token_to_id
        return [lookup.get(char, 0) for char in text]

    def decode(self, ids: Iterable[int]) -> str:
        tokens = self.id_to_token
        return "".join(tokens[i] if 0 < i < len(tokens) else "\ufffd" for i in ids)

    def to_dict(self) -> dict:
        return {"version": "1.0", "model": {"type": "Char", "vocab": self.id_to_token, "unk_token": UNK}}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict) -> CharTokenizer:
        return cls(data["model"]["vocab"][1:])
