"""Detokenization while decoding: the text of one sequence's new tokens, handed out as they come, and
whether it has reached a stop string. The one place this is done: ``generate``'s stop strings, the
text streamer, the serving engine and the command line all read a sequence's text through it.

Text is handed out only once it is final: never while it ends inside a character (a byte-level token
cut inside a UTF-8 sequence decodes to U+FFFD until the next token completes it), nor while its end
could be the start of a stop string; a stop string and whatever follows it are never handed out.
Each step decodes only its new tokens, with the few before them as context, so tokenizers that join
tokens (spaces between words, a leading-space marker) give exactly the text the whole would.
"""

from __future__ import annotations

from collections.abc import Iterable

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete multi-byte character


class IncrementalDetokenizer:
    """One sequence's new tokens -> its text, piece by piece (``add``, then ``finish`` at its end).

    ``text``: everything handed out so far; ``stopped``: a stop string was reached (the text ends
    before it, or with it when ``include_stop``, and nothing more is handed out). ``skip_special_tokens``: the
    tokenizer's special tokens add no text.
    """

    def __init__(self, tokenizer, stop_strings: Iterable[str] = (), include_stop: bool = False,
                 skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.include_stop = include_stop
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # handed out
        self.decoded = ""  # the text of the tokens decoded so far (handed out, or held back)
        self.prefix_offset = 0  # the tokens decoded again as context for the next ones
        self.read_offset = 0  # the tokens whose text is in ``decoded``
        self.stopped = False

    def add(self, token_ids: Iterable[int]) -> str:
        """Take the sequence's next tokens; the text that can be handed out now."""
        self.ids.extend(token_ids)
        return self._hand_out(final=False)

    def finish(self) -> str:
        """The sequence has ended: the text still held back (an incomplete character, what might have begun
        a stop string), unless a stop string ended it."""
        return self._hand_out(final=True)

    def _hand_out(self, final: bool) -> str:
        if self.stopped:
            return ""
        self.decoded += self._decode_new(final)
        decoded, stops = self.decoded, self.stop_strings
        search_from = max(0, len(self.text) - max((len(s) for s in stops), default=0))
        found = [(index, len(stop)) for index, stop in ((decoded.find(s, search_from), s) for s in stops) if index >= 0]
        if found:  # the earliest stop string (the longest of those starting there, when included)
            cut, length = min(found, key=lambda hit: (hit[0], -hit[1]))
            self.stopped = True
            decoded = decoded[:cut + length] if self.include_stop else decoded[:cut]
        elif not final:
            decoded = decoded[: len(decoded) - _stop_prefix_length(decoded, stops)]
        new = decoded[len(self.text):]
        self.text += new
        return new

    def _decode_new(self, final: bool) -> str:
        """The text the tokens not yet decoded add; nothing while it ends inside a character (unless
        ``final``). The last tokens decoded are decoded again as context for the new ones."""
        prefix, read = self.prefix_offset, self.read_offset
        if len(self.ids) <= read:
            return ""
        skip = self.skip_special_tokens
        before = self.tokenizer.decode(self.ids[prefix:read], skip_special_tokens=skip)
        after = self.tokenizer.decode(self.ids[prefix:], skip_special_tokens=skip)
        if not final and after.endswith(REPLACEMENT):
            return ""
        self.prefix_offset, self.read_offset = read, len(self.ids)
        return after[len(before):]


def _stop_prefix_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is the start of a stop string (held back)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest
