"""When a sequence is finished: it produced an end-of-sequence id, or (with a tokenizer) the text it
generated came to contain a stop string. The token that completes either is kept."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.generation.detokenize import IncrementalDetokenizer


class StopRule:
    """End-of-sequence ids and stop strings, checked on each new token of each row.

    Stop strings are looked for in the generated text only (never in the prompt), through one
    ``IncrementalDetokenizer`` per row, as the serving engine looks for them; an end token ends its
    row and is not read as text.
    """

    def __init__(self, eos_ids: Tensor | None, stop_strings: tuple[str, ...] = (), tokenizer=None,
                 prompt_length: int = 0) -> None:
        self.eos_ids = eos_ids
        self.stop_strings = stop_strings
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self._rows: dict[int, IncrementalDetokenizer] = {}  # each row's text so far

    @property
    def active(self) -> bool:
        """Whether anything can finish a row before the length limit."""
        return self.eos_ids is not None or bool(self.stop_strings)

    def hits(self, sequences: Tensor, length: int, rows: Tensor | None = None) -> Tensor:
        """Which rows of ``sequences`` (N, >= length) end with their token at column ``length - 1``, called
        once for each new token of a row, in order (greedy, sampling, speculative decoding).

        ``rows`` (N,) bool limits the stop-string check (the costly part) to those rows.
        """
        new_tokens = sequences[:, length - 1]
        hit = self._end_ids(new_tokens)
        if self.stop_strings:
            check = (~hit if rows is None else rows & ~hit).nonzero().flatten().tolist()
            for row in check:
                detokenizer = self._rows.get(row)
                if detokenizer is None:
                    detokenizer = self._rows[row] = IncrementalDetokenizer(self.tokenizer, self.stop_strings)
                    detokenizer.add(sequences[row, self.prompt_length:length - 1].tolist())
                detokenizer.add([int(new_tokens[row])])
                if detokenizer.stopped:
                    hit[row] = True
        return hit

    def hits_anywhere(self, sequences: Tensor, new_tokens: Tensor, lengths: list[int]) -> Tensor:
        """``hits`` for rows with no history (beam search's candidates, each from any beam), row r holding
        ``lengths[r]`` tokens, the last of them ``new_tokens[r]``: every row's generated text is read whole."""
        hit = self._end_ids(new_tokens)
        if self.stop_strings:
            for row in (~hit).nonzero().flatten().tolist():
                detokenizer = IncrementalDetokenizer(self.tokenizer, self.stop_strings)
                detokenizer.add(sequences[row, self.prompt_length:lengths[row]].tolist())
                hit[row] = detokenizer.stopped
        return hit

    def _end_ids(self, new_tokens: Tensor) -> Tensor:
        if self.eos_ids is None:
            return torch.zeros_like(new_tokens, dtype=torch.bool)
        return torch.isin(new_tokens, self.eos_ids)
