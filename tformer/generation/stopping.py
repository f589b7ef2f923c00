"""When a sequence is finished: it produced an end-of-sequence id, or (with a tokenizer) the
text it generated came to contain a stop string. The token that completes either is kept."""

from __future__ import annotations

import torch
from torch import Tensor


class StopRule:
    """End-of-sequence ids and stop strings, checked on each new token of each row.

    Stop strings are looked for in the generated text only (never in the prompt), decoded
    from a window of the last tokens wide enough to hold the longest stop string.
    """

    def __init__(self, eos_ids: Tensor | None, stop_strings: tuple[str, ...] = (), tokenizer=None,
                 prompt_length: int = 0) -> None:
        self.eos_ids = eos_ids
        self.stop_strings = stop_strings
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        # A token decodes to at least one byte, so this many tokens cover any stop string.
        self.window = max((len(s.encode("utf-8")) for s in stop_strings), default=0) + 1

    @property
    def active(self) -> bool:
        """Whether anything can finish a row before the length limit."""
        return self.eos_ids is not None or bool(self.stop_strings)

    def hits(self, sequences: Tensor, length: int, rows: Tensor | None = None) -> Tensor:
        """Which rows of ``sequences`` (N, >= length) end with their token at column ``length - 1``.

        ``rows`` (N,) bool limits the stop-string check (the costly part) to those rows.
        """
        new_tokens = sequences[:, length - 1]
        hit = torch.zeros_like(new_tokens, dtype=torch.bool)
        if self.eos_ids is not None:
            hit = torch.isin(new_tokens, self.eos_ids)
        if self.stop_strings:
            start = max(self.prompt_length, length - self.window)
            check = range(sequences.shape[0]) if rows is None else rows.nonzero().flatten().tolist()
            for row in check:
                text = self.tokenizer.decode(sequences[row, start:length].tolist())
                if any(stop in text for stop in self.stop_strings):
                    hit[row] = True
        return hit
