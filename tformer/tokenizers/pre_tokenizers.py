"""Pre-tokenizers for WordPiece: how normalized text is cut into the words WordPiece splits
further. BERT's (whitespace removed, each punctuation character a word of its own) and
Hugging Face's Whitespace / WhitespaceSplit."""

from __future__ import annotations

import re

import regex

from tformer.tokenizers.errors import TokenizerError

_SPACE = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_ASCII_SPACE = r"\t\n\x0b\x0c\r "
# BERT's punctuation: every ASCII non-alphanumeric printable character, and Unicode's P* categories.
_ASCII_PUNCT = r"""!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~"""


class PreTokenizer:
    """A text → words step, described in tokenizer.json by ``to_json``."""

    kind = ""

    def __call__(self, text: str) -> list[str]:
        return self._pattern_for(text).findall(text)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) of each word in ``text`` (what offsets are made from)."""
        return [match.span() for match in self._pattern_for(text).finditer(text)]

    def _pattern_for(self, text: str):
        return self._pattern

    def to_json(self) -> dict:
        return {"type": self.kind}


class BertPreTokenizer(PreTokenizer):
    """Split on whitespace (dropped) and on punctuation (kept, one character per word)."""

    kind = "BertPreTokenizer"
    _ascii = re.compile(rf"[^{_ASCII_SPACE}{_ASCII_PUNCT}]+|[{_ASCII_PUNCT}]")
    _unicode = regex.compile(rf"[^{_SPACE}\p{{P}}{_ASCII_PUNCT}]+|[\p{{P}}{_ASCII_PUNCT}]")

    def __call__(self, text: str) -> list[str]:
        return (self._ascii if text.isascii() else self._unicode).findall(text)

    def _pattern_for(self, text: str):
        return self._ascii if text.isascii() else self._unicode


class WhitespacePreTokenizer(PreTokenizer):
    """Hugging Face's Whitespace: runs of word characters, and runs of other non-space ones."""

    kind = "Whitespace"
    _pattern = regex.compile(r"\w+|[^\w\s]+")


class WhitespaceSplitPreTokenizer(PreTokenizer):
    """Hugging Face's WhitespaceSplit: split on whitespace only."""

    kind = "WhitespaceSplit"
    _pattern = regex.compile(rf"[^{_SPACE}]+")


_KINDS = {cls.kind: cls for cls in (BertPreTokenizer, WhitespacePreTokenizer, WhitespaceSplitPreTokenizer)}


def pre_tokenizer_from_json(data: dict | None) -> PreTokenizer:
    kind = None if data is None else data.get("type")
    if kind not in _KINDS:
        raise TokenizerError(f"WordPiece pre_tokenizer {kind!r} is not supported; known: {', '.join(_KINDS)}")
    return _KINDS[kind]()
