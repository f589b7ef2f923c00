"""Pre-tokenizers: how normalized text is cut into the words a model splits further. For
WordPiece, BERT's (whitespace removed, each punctuation character a word of its own) and
Hugging Face's Whitespace / WhitespaceSplit; Hugging Face's general Split (a string or regex
and what to do with its matches), which Gemma's SentencePiece-style BPE uses."""

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


# Hugging Face's Split behaviours: what becomes of the matched delimiters.
SPLIT_BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")


class SplitPreTokenizer(PreTokenizer):
    """Hugging Face's Split: cut at each match of a string or regex ``pattern`` (with ``invert``,
    at what lies between matches); ``behavior`` drops the delimiters ("Removed"), keeps each as a
    word ("Isolated"), glues each to the word before or after it ("MergedWithPrevious" / "Next")
    or joins neighbouring ones ("Contiguous"). Empty words are dropped, as in Hugging Face."""

    kind = "Split"

    def __init__(self, pattern: str, is_regex: bool, behavior: str, invert: bool = False) -> None:
        if behavior not in SPLIT_BEHAVIORS:
            raise TokenizerError(f"Split behavior {behavior!r} is not supported; known: {', '.join(SPLIT_BEHAVIORS)}")
        if not isinstance(pattern, str) or not pattern:
            raise TokenizerError(f"a Split pre_tokenizer needs a non-empty str pattern, got {pattern!r}")
        try:
            self._pattern = regex.compile(pattern if is_regex else regex.escape(pattern))
        except regex.error as error:
            raise TokenizerError(f"Split pattern {pattern!r} is not a valid regex: {error}") from None
        self.pattern, self.is_regex, self.behavior, self.invert = pattern, is_regex, behavior, bool(invert)

    def __call__(self, text: str) -> list[str]:
        return [text[start:end] for start, end in self.spans(text)]

    def _matches(self, text: str) -> list[tuple[int, int, bool]]:
        """(start, end, is_delimiter) tiling ``text``."""
        pieces: list[tuple[int, int, bool]] = []
        previous = 0
        for match in self._pattern.finditer(text):
            start, end = match.span()
            if start == end and self.behavior not in ("Removed", "Isolated"):
                raise TokenizerError(f"Split pattern {self.pattern!r} matched the empty string at {start}; with "
                                     f"behavior {self.behavior} only patterns that match characters are supported")
            if start > previous:
                pieces.append((previous, start, self.invert))
            pieces.append((start, end, not self.invert))
            previous = end
        if previous < len(text):
            pieces.append((previous, len(text), self.invert))
        return pieces

    def spans(self, text: str) -> list[tuple[int, int]]:
        pieces = self._matches(text)
        behavior = self.behavior
        if behavior == "Removed":
            return [(start, end) for start, end, delimiter in pieces if not delimiter and end > start]
        if behavior == "MergedWithNext":  # Hugging Face folds from the right, then reverses
            mirrored = self._merged([(-end, -start, delimiter) for start, end, delimiter in reversed(pieces)], behavior)
            return [(-end, -start) for start, end in reversed(mirrored) if end > start]
        return [(start, end) for start, end in self._merged(pieces, behavior) if end > start]

    @staticmethod
    def _merged(pieces: list[tuple[int, int, bool]], behavior: str) -> list[tuple[int, int]]:
        """Hugging Face's fold: a delimiter (or, for Contiguous, a piece of the same kind as the
        one before) extends the previous span instead of starting one."""
        spans: list[list[int]] = []
        previous = False
        for start, end, delimiter in pieces:
            if behavior == "Contiguous":
                extend = delimiter == previous
            else:
                extend = behavior != "Isolated" and delimiter and not previous
            if extend and spans:
                spans[-1][1] = end
            else:
                spans.append([start, end])
            previous = delimiter
        return [(start, end) for start, end in spans]

    def to_json(self) -> dict:
        return {"type": "Split", "pattern": {"Regex" if self.is_regex else "String": self.pattern},
                "behavior": self.behavior, "invert": self.invert}

    @classmethod
    def from_json(cls, data: dict) -> SplitPreTokenizer:
        pattern = data.get("pattern") or {}
        if len(pattern) != 1 or not ({"String", "Regex"} & set(pattern)):
            raise TokenizerError(f"Split pattern {pattern!r} is not supported; a pattern is {{\"String\": ...}} or "
                                 "{\"Regex\": ...}")
        is_regex = "Regex" in pattern
        return cls(pattern["Regex" if is_regex else "String"], is_regex, data.get("behavior", "Isolated"),
                   bool(data.get("invert", False)))


_KINDS = {cls.kind: cls for cls in (BertPreTokenizer, WhitespacePreTokenizer, WhitespaceSplitPreTokenizer)}


def pre_tokenizer_from_json(data: dict | None) -> PreTokenizer:
    kind = None if data is None else data.get("type")
    if kind not in _KINDS:
        raise TokenizerError(f"WordPiece pre_tokenizer {kind!r} is not supported; known: {', '.join(_KINDS)}")
    return _KINDS[kind]()
