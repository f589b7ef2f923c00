"""What ``generate`` returns when asked for more than the token ids."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class GenerationOutput:
    """The result of one ``generate`` call.

    ``sequences`` (B * num_return_sequences, T + new): prompts followed by the new tokens;
    rows that finished early are filled with the pad id.
    ``scores``: with ``output_scores``, one (rows, V) tensor per generated position: the
    processed scores each token was chosen from (greedy / sampling / speculative: logits
    after min-length, temperature, top-k and top-p; beam search: the log-probabilities of
    every continuation of every beam, as Hugging Face reports them).
    ``sequences_scores`` (beam search): each returned sequence's summed log-probability
    divided by its generated length ** length_penalty.
    Speculative decoding counts the drafted and accepted tokens.
    """

    sequences: Tensor
    prompt_length: int
    scores: tuple[Tensor, ...] | None = None
    sequences_scores: Tensor | None = None
    draft_tokens: int | None = None
    accepted_draft_tokens: int | None = None

    @property
    def new_tokens(self) -> Tensor:
        """(rows, new) the generated part of ``sequences``."""
        return self.sequences[:, self.prompt_length:]

    @property
    def acceptance_rate(self) -> float | None:
        """Speculative decoding: the fraction of drafted tokens the target accepted."""
        if not self.draft_tokens:
            return None
        return self.accepted_draft_tokens / self.draft_tokens
