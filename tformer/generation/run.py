"""The state one ``generate`` call shares with its decoding strategy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.generation.sampling import TokenChooser
from tformer.generation.settings import GenerationConfig
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

    @classmethod
    def start(cls, prompt: Tensor, config: GenerationConfig, model_config, chooser: TokenChooser, tokenizer=None,
              prompt_padding: Tensor | None = None) -> DecodingRun:
        """A run of ``config`` from the decoders' prompts (B, T), their buffer filled with the pad id after them."""
        batch, prompt_length = prompt.shape
        device = prompt.device
        pad_id = config.pad_id(model_config)
        sequences = torch.full((batch, prompt_length + config.max_new_tokens), pad_id, dtype=torch.long, device=device)
        sequences[:, :prompt_length] = prompt
        end_ids = config.end_ids(model_config)
        eos_ids = torch.tensor(end_ids, dtype=torch.long, device=device) if end_ids else None
        generator = None if config.seed is None else torch.Generator(device=device).manual_seed(config.seed)
        return cls(sequences=sequences, prompt_length=prompt_length, max_new_tokens=config.max_new_tokens,
                   chooser=chooser, stop=StopRule(eos_ids, config.stop_strings, tokenizer, prompt_length),
                   pad_id=pad_id, generator=generator, scores=[] if config.output_scores else None,
                   prompt_padding=prompt_padding)

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
