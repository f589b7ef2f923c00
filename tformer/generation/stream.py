"""Streaming: text printed as tokens arrive, for ``generate(..., streamer=TextStreamer(tok))``.

A streamer is any callable that receives each chunk of new tokens (B, n) as it is produced;
``stream_generate`` offers the same chunks as an iterator instead.
"""

from __future__ import annotations

import sys
from typing import TextIO

from torch import Tensor

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete multi-byte character


class TextStreamer:
    """Decodes the new tokens of one sequence and writes the text as soon as it is complete.

    Text ending in an incomplete character (a byte-level token cut inside a UTF-8 sequence)
    is held back until the following token completes it. ``text`` holds everything written.
    """

    def __init__(self, tokenizer, file: TextIO | None = None) -> None:
        self.tokenizer = tokenizer
        self.file = file if file is not None else sys.stdout
        self.token_ids: list[int] = []
        self.text = ""

    def __call__(self, tokens: Tensor) -> None:
        if tokens.shape[0] != 1:
            raise ValueError(f"TextStreamer prints one sequence; got a batch of {tokens.shape[0]}")
        self.token_ids.extend(tokens[0].tolist())
        decoded = self.tokenizer.decode(self.token_ids)
        if decoded.endswith(REPLACEMENT):
            return
        self._write(decoded)

    def end(self) -> None:
        """Write whatever is still held back (the sequence ended inside a character)."""
        self._write(self.tokenizer.decode(self.token_ids))

    def _write(self, decoded: str) -> None:
        new = decoded[len(self.text):]
        if new:
            self.file.write(new)
            self.file.flush()
        self.text = decoded
