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
    length: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    def __post_init__(self) -> None:
        self.length = self.prompt_length

    @property
    def generated(self) -> int:
        """New tokens written so far."""
        return self.length - self.prompt_length

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.generated
