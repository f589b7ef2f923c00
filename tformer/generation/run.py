"""The state one ``generate`` call shares with its decoding strategy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.generation.sampling import TokenChooser
from tformer.generation.stopping import StopRule


@dataclass
class DecodingRun:
    """The output buffer being filled and the rules for filling it.

    ``sequences`` (B, T + max_new_tokens) starts with the prompts; a strategy writes new
    tokens at column ``length`` and advances it. Rows that finish early get ``pad_id``.
    """

    sequences: Tensor
    prompt_length: int
    max_new_tokens: int
    chooser: TokenChooser
    stop: StopRule
    pad_id: int
    generator: torch.Generator | None = None
    scores: list[Tensor] | None = None  # one (B, V) tensor per new token when asked for
    prompt_padding: Tensor | None = None  # (B, prompt_length) True at a prompt's left padding
    length: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    def __post_init__(self) -> None:
        self.length = self.prompt_length
        prompt = self.sequences[:, : self.prompt_length]
        self._prompt_history = prompt if self.prompt_padding is None else prompt.masked_fill(self.prompt_padding, -1)

    def history(self) -> Tensor:
        """Each row's tokens so far (B, length), prompt included, -1 at its prompt's left padding (no token: a
        logits rule reading them skips it, as Hugging Face's repetition penalty skips the padding)."""
        return torch.cat([self._prompt_history, self.sequences[:, self.prompt_length : self.length]], dim=1)

    @property
    def generated(self) -> int:
        """New tokens written so far."""
        return self.length - self.prompt_length

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.generated
