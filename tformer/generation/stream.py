"""Streaming: text printed as tokens arrive, for ``generate(..., streamer=TextStreamer(tok))``.

A streamer is any callable that receives each chunk of new tokens (B, n) as it is produced;
``stream_generate`` offers the same chunks as an iterator instead.
"""

from __future__ import annotations

import sys
from typing import TextIO

from torch import Tensor

from tformer.generation.detokenize import IncrementalDetokenizer


class TextStreamer:
    """Decodes the new tokens of one sequence (``IncrementalDetokenizer``) and writes the text as soon as
    it is complete: text ending in an incomplete character is held back until the following token
    completes it. ``text`` holds everything written."""

    def __init__(self, tokenizer, file: TextIO | None = None) -> None:
        self.tokenizer = tokenizer
        self.file = file if file is not None else sys.stdout
        self.detokenizer = IncrementalDetokenizer(tokenizer)

    @property
    def text(self) -> str:
        return self.detokenizer.text

    @property
    def token_ids(self) -> list[int]:
        return self.detokenizer.ids

    def __call__(self, tokens: Tensor) -> None:
        if tokens.shape[0] != 1:
            raise ValueError(f"TextStreamer prints one sequence; got a batch of {tokens.shape[0]}")
        self._write(self.detokenizer.add(tokens[0].tolist()))

    def end(self) -> None:
        """Write whatever is still held back (the sequence ended inside a character)."""
        self._write(self.detokenizer.finish())

    def _write(self, new: str) -> None:
        if new:
            self.file.write(new)
            self.file.flush()
