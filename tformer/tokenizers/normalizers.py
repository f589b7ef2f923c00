"""Normalizers: how text is cleaned before it is cut into words. BERT's (control characters
dropped, whitespace made plain, Chinese characters spaced out, accents stripped, lower-cased)
and the simple Unicode steps Hugging Face files chain together. Each is a callable with a
``to_json`` in the tokenizer.json layout."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from itertools import chain, repeat

import regex

from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.precompiled import CharsMap

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


_GRAPHEMES = regex.compile(r"\X")
# Hugging Face's Precompiled step looks a whole grapheme up only when its UTF-8 form is shorter than this.
_WHOLE_GRAPHEME_BYTES = 6


class Normalizer:
    """A text → text step."""

    def __call__(self, text: str) -> str:
        raise NotImplementedError

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        """The normalized text and its :data:`Alignment` to ``text`` (what offsets are made from)."""
        name = (self.to_json() or {}).get("type", type(self).__name__)
        raise TokenizerError(f"offsets are not supported through the {name} normalizer; they are "
                             "through BertNormalizer, Precompiled, Lowercase, StripAccents, Prepend, a one-character "
                             "Replace and none")

    def to_json(self) -> dict | None:
        raise NotImplementedError


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
                                 f"Precompiled, Replace, Prepend, {', '.join(self.KINDS)}")
        self.kind = kind
        self._pieces = _PieceTable(self)

    def __call__(self, text: str) -> str:
        if self.kind == "Lowercase":
            return lowercase(text)
        if self.kind == "StripAccents":  # removes marks only; Hugging Face pairs it with NFD
            return text.translate(_STRIP_MARKS)
        return unicodedata.normalize(self.kind, text)

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        """Lowercase and StripAccents character by character; NFC and the others only on text
        they leave as it is (Qwen2's NFC on NFC text), since (de)composition moves characters
        across others in ways not reproduced here."""
        if self.kind in ("Lowercase", "StripAccents"):
            return _aligned_by_character(self._pieces, text)
        if unicodedata.is_normalized(self.kind, text):
            return text, None
        raise TokenizerError(f"offsets are not supported through the {self.kind} normalizer on text it changes "
                             f"(not in {self.kind} form); they are on text already in {self.kind} form")

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


class PrecompiledNormalizer(Normalizer):
    """Hugging Face's ``Precompiled`` normalizer over a base64 ``precompiled_charsmap``: each
    grapheme shorter than 6 UTF-8 bytes is looked up whole, else (or failing that) each of its
    characters; a character of the replacement stands for the grapheme's character at the
    same position, extra ones for its last (so offsets match Hugging Face's)."""

    def __init__(self, charsmap_base64: str) -> None:
        self.charsmap_base64 = charsmap_base64
        self.charsmap = CharsMap(charsmap_base64)
        self._graphemes: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._ascii = {code: self._grapheme(chr(code))[0] for code in range(128)}

    def _grapheme(self, grapheme: str) -> tuple[str, tuple[int, ...]]:
        """A grapheme's normalized form and, for each of its characters, the index in the
        grapheme of the character it stands for; remembered."""
        cached = self._graphemes.get(grapheme)
        if cached is not None:
            return cached
        whole = None
        if len(grapheme.encode("utf-8")) < _WHOLE_GRAPHEME_BYTES:
            whole = self.charsmap.lookup(grapheme)
        if whole is not None:
            last = len(grapheme) - 1
            result = whole, tuple(min(index, last) for index in range(len(whole)))
        else:
            parts, sources = [], []
            for index, char in enumerate(grapheme):
                replacement = self.charsmap.lookup(char)
                replacement = char if replacement is None else replacement
                parts.append(replacement)
                sources += [index] * len(replacement)
            result = "".join(parts), tuple(sources)
        self._graphemes[grapheme] = result
        return result

    @staticmethod
    def _one_character_graphemes(text: str) -> bool:
        """Whether every character is a grapheme of its own (ASCII but CR LF): the fast path."""
        return text.isascii() and "\r\n" not in text

    def _pieces(self, text: str) -> list[str]:
        return list(text) if self._one_character_graphemes(text) else _GRAPHEMES.findall(text)

    def __call__(self, text: str) -> str:
        if self._one_character_graphemes(text):
            return text.translate(self._ascii)
        return "".join(self._grapheme(grapheme)[0] for grapheme in _GRAPHEMES.findall(text))

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        parts: list[str] = []
        source: list[int] = []
        position = 0
        for grapheme in self._pieces(text):
            normalized, sources = self._grapheme(grapheme)
            parts.append(normalized)
            source += [position + index for index in sources]
            position += len(grapheme)
        normalized = "".join(parts)
        if len(source) == len(text) and source == list(range(len(text))):
            return normalized, None
        return normalized, source

    def to_json(self) -> dict:
        return {"type": "Precompiled", "precompiled_charsmap": self.charsmap_base64}


class ReplaceNormalizer(Normalizer):
    """Hugging Face's ``Replace`` with a plain-string pattern (regex patterns are refused)."""

    def __init__(self, pattern: str, content: str) -> None:
        if not pattern:
            raise TokenizerError("a Replace normalizer needs a non-empty pattern")
        self.pattern = pattern
        self.content = content

    def __call__(self, text: str) -> str:
        return text.replace(self.pattern, self.content)

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        """One character for one (Llama 2's and Gemma's " " -> "▁") keeps every position."""
        if len(self.pattern) != 1 or len(self.content) != 1:
            return super().normalize_aligned(text)
        return self(text), None

    def to_json(self) -> dict:
        return {"type": "Replace", "pattern": {"String": self.pattern}, "content": self.content}


class PrependNormalizer(Normalizer):
    """Hugging Face's ``Prepend``: ``prepend`` put before any non-empty text (legacy Llama 2 and
    Mistral files put "▁" there, SentencePiece's mark of a word start). The added characters
    stand for the text's first character, as in Hugging Face's offsets."""

    def __init__(self, prepend: str) -> None:
        if not isinstance(prepend, str) or not prepend:
            raise TokenizerError(f"a Prepend normalizer needs a non-empty str to prepend, got {prepend!r}")
        self.prepend = prepend

    def __call__(self, text: str) -> str:
        return self.prepend + text if text else text

    def normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        if not text:
            return text, None
        return self.prepend + text, [0] * len(self.prepend) + list(range(len(text)))

    def to_json(self) -> dict:
        return {"type": "Prepend", "prepend": self.prepend}


def _replace_from_json(data: dict) -> ReplaceNormalizer:
    pattern = data.get("pattern") or {}
    if "String" not in pattern or not isinstance(data.get("content"), str):
        raise TokenizerError(f"Replace normalizer with pattern {pattern!r} is not supported; only a String pattern is")
    return ReplaceNormalizer(pattern["String"], data["content"])


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
    if kind == "Precompiled":
        return PrecompiledNormalizer(data.get("precompiled_charsmap", ""))
    if kind == "Replace":
        return _replace_from_json(data)
    if kind == "Prepend":
        return PrependNormalizer(data.get("prepend"))
    return UnicodeStep(kind)
