"""Normalizers: how text is cleaned before it is cut into words. BERT's (control characters
dropped, whitespace made plain, Chinese characters spaced out, accents stripped, lower-cased)
and the simple Unicode steps Hugging Face files chain together. Each is a callable with a
``to_json`` in the tokenizer.json layout."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from itertools import chain, repeat

from tformer.tokenizers.errors import TokenizerError

# Unicode's White_Space characters (Rust's char::is_whitespace, which Hugging Face uses).
WHITE_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
                        "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

# The CJK Unified Ideograph blocks BERT puts spaces around (Hangul, kana are not among them).
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def is_chinese_char(code_point: int) -> bool:
    return any(low <= code_point <= high for low, high in _CJK_RANGES)


class _CharTable(dict):
    """A ``str.translate`` table filled on demand: each code point's replacement is computed
    once by ``rule`` and remembered, so cleaning stays a C-speed loop."""

    def __init__(self, rule: Callable[[str], str]) -> None:
        super().__init__()
        self._rule = rule

    def __missing__(self, code_point: int) -> str:
        replacement = self[code_point] = self._rule(chr(code_point))
        return replacement


def _bert_clean_rule(char: str, handle_chinese_chars: bool) -> str:
    if char in "\t\n\r":
        return " "
    category = unicodedata.category(char)
    # Control, format, private-use and surrogate characters go; unassigned ones (Cn) stay, as in
    # Hugging Face's tokenizer, and become [UNK] later.
    if char in ("\x00", "\ufffd") or (category.startswith("C") and category != "Cn"):
        return ""
    if char in WHITE_SPACE:
        return " "
    if handle_chinese_chars and is_chinese_char(ord(char)):
        return f" {char} "
    return char


def _strip_marks_rule(char: str) -> str:
    return "" if unicodedata.category(char) == "Mn" else char


_STRIP_MARKS = _CharTable(_strip_marks_rule)


def lowercase(text: str) -> str:
    """Lower-case character by character, as Hugging Face does: a word-final "Σ" becomes "σ",
    not the "ς" that Python's context-aware ``str.lower`` gives."""
    if "Σ" in text:
        return "".join(char.lower() for char in text)
    return text.lower()


def strip_accents(text: str) -> str:
    """Decompose (NFD) and drop the nonspacing marks: "Héllo" → "Hello"."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFD", text).translate(_STRIP_MARKS)


# Where each character of a normalized text comes from: ``source[j]`` is the index in the original
# text of the character that normalized character ``j`` was made from; None when they are the same.
Alignment = list[int] | None


class Normalizer:
    """A text → text step."""

    def __call__(self, text: str) -> str:
        raise NotImplementedError

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        """The normalized text and its :data:`Alignment` to ``text`` (what offsets are made from)."""
        raise TokenizerError(f"offsets are not supported through the {type(self).__name__} normalizer; "
                             "they are through BertNormalizer, Lowercase, StripAccents and none")


class _PieceTable(dict):
    """Each character's normalized form, computed once by ``rule`` and remembered."""

    def __init__(self, rule: Callable[[str], str]) -> None:
        super().__init__()
        self._rule = rule

    def __missing__(self, char: str) -> str:
        piece = self[char] = self._rule(char)
        return piece


def _aligned_by_character(pieces: _PieceTable, text: str) -> tuple[str, Alignment]:
    """Normalize character by character, as Hugging Face aligns these steps: every character a
    source character turns into (none, one or several) points back to it."""
    parts = list(map(pieces.__getitem__, text))
    lengths = list(map(len, parts))
    normalized = "".join(parts)
    if lengths.count(1) == len(lengths):
        return normalized, None
    return normalized, list(chain.from_iterable(map(repeat, range(len(lengths)), lengths)))

    def to_json(self) -> dict:
        raise NotImplementedError


class NoNormalizer(Normalizer):
    """Text used as it is (a tokenizer.json with ``"normalizer": null``)."""

    def __call__(self, text: str) -> str:
        return text

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        return text, None

    def to_json(self) -> None:
        return None


class BertNormalizer(Normalizer):
    """BERT's normalizer, in Hugging Face's order: clean control characters and whitespace,
    space out Chinese characters, strip accents (by default when lower-casing), lower-case."""

    def __init__(self, clean_text: bool = True, handle_chinese_chars: bool = True,
                 strip_accents: bool | None = None, lowercase: bool = True) -> None:
        self.clean_text = clean_text
        self.handle_chinese_chars = handle_chinese_chars
        self.strip_accents = strip_accents
        self.lowercase = lowercase
        if clean_text:
            self._table = _CharTable(lambda char: _bert_clean_rule(char, handle_chinese_chars))
        elif handle_chinese_chars:
            self._table = _CharTable(lambda char: f" {char} " if is_chinese_char(ord(char)) else char)
        else:
            self._table = None
        self._pieces = _PieceTable(self)

    def __call__(self, text: str) -> str:
        if self._table is not None:
            text = text.translate(self._table)
        if self.lowercase if self.strip_accents is None else self.strip_accents:
            text = strip_accents(text)
        if self.lowercase:
            text = lowercase(text)
        return text

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        if text.isascii():  # one for one, or characters dropped (controls): same length means untouched
            normalized = self(text)
            if len(normalized) == len(text):
                return normalized, None
        return _aligned_by_character(self._pieces, text)

    def to_json(self) -> dict:
        return {"type": "BertNormalizer", "clean_text": self.clean_text, "handle_chinese_chars":
                self.handle_chinese_chars, "strip_accents": self.strip_accents, "lowercase": self.lowercase}


class UnicodeStep(Normalizer):
    """One of Hugging Face's simple steps: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents."""

    KINDS = ("NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents")

    def __init__(self, kind: str) -> None:
        if kind not in self.KINDS:
            raise TokenizerError(f"normalizer {kind!r} is not supported; known: BertNormalizer, Sequence, "
                                 f"{', '.join(self.KINDS)}")
        self.kind = kind
        self._pieces = _PieceTable(self)

    def __call__(self, text: str) -> str:
        if self.kind == "Lowercase":
            return lowercase(text)
        if self.kind == "StripAccents":  # removes marks only; Hugging Face pairs it with NFD
            return text.translate(_STRIP_MARKS)
        return unicodedata.normalize(self.kind, text)

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        if self.kind not in ("Lowercase", "StripAccents"):  # (de)composition moves characters across others
            raise TokenizerError(f"offsets are not supported through the {self.kind} normalizer; they are through "
                                 "BertNormalizer, Lowercase, StripAccents and none")
        return _aligned_by_character(self._pieces, text)

    def to_json(self) -> dict:
        return {"type": self.kind}


class SequenceNormalizer(Normalizer):
    def __init__(self, steps: list[Normalizer]) -> None:
        self.steps = steps

    def __call__(self, text: str) -> str:
        for step in self.steps:
            text = step(text)
        return text

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        source: Alignment = None
        for step in self.steps:
            text, step_source = step.normalize_aligned(text)
            if step_source is not None:
                source = step_source if source is None else [source[index] for index in step_source]
        return text, source

    def to_json(self) -> dict:
        return {"type": "Sequence", "normalizers": [step.to_json() for step in self.steps]}


def normalizer_from_json(data: dict | None) -> Normalizer | None:
    """The normalizer a tokenizer.json describes (None for none)."""
    if data is None:
        return None
    kind = data.get("type")
    if kind == "BertNormalizer":
        return BertNormalizer(
            clean_text=data.get("clean_text", True), handle_chinese_chars=data.get("handle_chinese_chars", True),
            strip_accents=data.get("strip_accents"), lowercase=data.get("lowercase", True),
        )
    if kind == "Sequence":
        return SequenceNormalizer([step for step in map(normalizer_from_json, data.get("normalizers", [])) if step])
    return UnicodeStep(kind)
