"""GPT-2's byte level: every UTF-8 byte is shown as one printable character, so a byte-level
BPE vocabulary is made of ordinary strings and never needs an unknown token; and GPT-2's
pre-tokenization pattern, which cuts text into the words that BPE merges inside of."""

from __future__ import annotations

import re

import regex

# The pattern GPT-2 (and Hugging Face's ByteLevel pre-tokenizer) cuts text with: English
# contractions, letters with an optional leading space, digits likewise, other symbols
# likewise, then whitespace (a run that is followed by a non-space keeps its last space for
# the next word). Every character is matched by one alternative, so the matches tile the text.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# The same pattern restricted to ASCII text, for the standard-library engine, which is about
# twice as fast as `regex` here. On ASCII, \p{L} is [A-Za-z], \p{N} is [0-9] and \s is the six
# White_Space characters below (not \x1c-\x1f, which `re`'s \s would also take).
_ASCII_SPACE = r"\t\n\x0b\x0c\r "
_GPT2_ASCII_PATTERN = (
    rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_ASCII_SPACE}A-Za-z0-9]+"""
    rf"""|[{_ASCII_SPACE}]+(?![^{_ASCII_SPACE}])|[{_ASCII_SPACE}]+"""
)


def _bytes_to_unicode() -> list[str]:
    """The character standing for each byte 0..255: printable Latin-1 bytes stand for
    themselves, the others (controls, space, soft hyphen...) for 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: list[str] = []
    shifted = 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + shifted))
            shifted += 1
    return chars


BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {char: byte for byte, char in enumerate(BYTE_TO_CHAR)}
# latin-1 decoding turns bytes into code points 0..255; this table then maps each to its character.
_LATIN1_TO_BYTE_CHAR = {byte: char for byte, char in enumerate(BYTE_TO_CHAR)}


def to_byte_chars(text: str) -> str:
    """``text``'s UTF-8 bytes, one byte-level character each (how byte-level vocabularies spell it)."""
    return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHAR)


def token_bytes(token: str) -> bytes:
    """The bytes a byte-level token stands for. A token with a character outside the byte
    alphabet (an added token such as "<|endoftext|>" is fine, "é" is not) stands for its own UTF-8,
    as in Hugging Face's ByteLevel decoder."""
    try:
        return bytes(CHAR_TO_BYTE[char] for char in token)
    except KeyError:
        return token.encode("utf-8")


class PreTokenizer:
    """Cuts text into words with a regex; ``isolated`` keeps the text between matches as words
    too (Hugging Face's Split with behavior "Isolated"), so no character is ever dropped."""

    def __init__(self, pattern: str = GPT2_PATTERN) -> None:
        try:
            self._regex = regex.compile(pattern)
        except regex.error as error:
            raise ValueError(f"invalid pre-tokenization pattern {pattern!r}: {error}") from None
        self.pattern = pattern
        self._ascii = re.compile(_GPT2_ASCII_PATTERN) if pattern == GPT2_PATTERN else None
        # GPT-2's pattern matches every character, so its matches already tile the text.
        self._tiles = pattern == GPT2_PATTERN

    def __call__(self, text: str) -> list[str]:
        if self._ascii is not None and text.isascii():
            return self._ascii.findall(text)
        if self._tiles:
            return self._regex.findall(text)
        words: list[str] = []
        start = 0
        for match in self._regex.finditer(text):
            if match.start() > start:
                words.append(text[start:match.start()])
            if match.end() > match.start():
                words.append(match.group())
            start = match.end()
        if start < len(text):
            words.append(text[start:])
        return words
