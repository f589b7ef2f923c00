"""From logits to the next token: the forced last token at the length limit, suppressed tokens (always, and
at the first new token), end-of-sequence forbidden before ``min_new_tokens``, then greedy argmax, or
sampling after temperature, top-k and top-p (nucleus) filtering, in that order."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.generation.settings import GenerationConfig


def filter_top_k(logits: Tensor, top_k: int) -> Tensor:
    """Keep the ``top_k`` largest logits of each row (B, V) (ties with the k-th kept too); -inf elsewhere."""
    if top_k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, float("-inf"))


def filter_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most probable tokens whose probability reaches ``top_p`` (nucleus)."""
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probabilities = sorted_logits.softmax(-1)
    # A token is dropped when the tokens before it already reach top_p; the top one always stays.
    drop_sorted = (probabilities.cumsum(-1) - probabilities) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


@dataclass(frozen=True)
class TokenChooser:
    """How one next token is chosen from a row of logits."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    eos_ids: Tensor | None = None  # (E,) ids that end a sequence
    min_new_tokens: int = 0
    forced_eos_id: int | None = None  # the only token allowed as the last of max_new_tokens
    max_new_tokens: int | None = None
    suppress_ids: Tensor | None = None  # (S,) ids never chosen (Hugging Face's suppress_tokens)
    begin_suppress_ids: Tensor | None = None  # (S,) ids not chosen as the first new token (begin_suppress_tokens)

    @classmethod
    def from_config(cls, config: GenerationConfig, model_config, device: torch.device | None = None) -> TokenChooser:
        """The chooser ``config`` asks for with this model: its end ids (the model config's by default) on
        ``device``, the forced last token, the minimum and maximum new tokens, the suppressed tokens (the model
        config's by default), the sampling options. The one way ``generate`` and the serving engine make
        theirs, so they choose alike."""
        end_ids = config.end_ids(model_config)
        suppress, begin_suppress = config.suppressed_ids(model_config)

        def ids(values: tuple[int, ...]) -> Tensor | None:
            return torch.tensor(values, dtype=torch.long, device=device) if values else None

        return cls(config.sampling, float(config.temperature), config.top_k,
                   None if config.top_p is None else float(config.top_p), ids(end_ids),
                   config.min_new_tokens, config.forced_end_id(model_config), config.max_new_tokens,
                   ids(suppress), ids(begin_suppress))

    def alters(self, generated: int) -> bool:
        """Whether the token after ``generated`` new ones is anything but the argmax of the logits: sampling,
        an end id forbidden before ``min_new_tokens``, suppressed tokens, or the forced last token."""
        if self.do_sample or self.suppress_ids is not None:
            return True
        if generated == 0 and self.begin_suppress_ids is not None:
            return True
        if self.forced_eos_id is not None and self.max_new_tokens is not None \
                and generated == self.max_new_tokens - 1:
            return True
        return generated < self.min_new_tokens and self.eos_ids is not None

    def scores(self, logits: Tensor, generated: int, consecutive: bool = False) -> Tensor:
        """Processed float scores (B, V) for the token after ``generated`` new ones: logits with only the
        forced end allowed at the last step, the suppressed tokens (and at the first new token the
        begin-suppressed ones) -inf, end-of-sequence forbidden while ``generated < min_new_tokens``, then
        (sampling only) divided by the temperature and filtered by top-k and top-p (-inf = never chosen).
        Each rule masks what Hugging Face's logits processor of the same name masks, on logits (greedy,
        sampling) or log-probabilities (beam search) alike.

        ``consecutive``: the rows are successive positions of one sequence, row i coming after
        ``generated + i`` new tokens (speculative decoding's verification)."""
        scores = logits.float()
        if self.forced_eos_id is not None and self.max_new_tokens is not None:
            last = self.max_new_tokens - 1 - generated  # the row that chooses the last token allowed
            if consecutive and 0 <= last < scores.shape[0]:
                scores = torch.cat([scores[:last], _only(scores[last:last + 1], self.forced_eos_id),
                                    scores[last + 1:]])
            elif not consecutive and last == 0:
                scores = _only(scores, self.forced_eos_id)
        if self.suppress_ids is not None:
            scores = scores.index_fill(-1, self.suppress_ids, float("-inf"))
        if self.begin_suppress_ids is not None:
            if consecutive and generated == 0:  # only the first row chooses the first new token
                scores = torch.cat([scores[:1].index_fill(-1, self.begin_suppress_ids, float("-inf")), scores[1:]])
            elif not consecutive and generated == 0:
                scores = scores.index_fill(-1, self.begin_suppress_ids, float("-inf"))
        if generated < self.min_new_tokens and self.eos_ids is not None:
            early = self.min_new_tokens - generated if consecutive else scores.shape[0]
            forbidden = scores[:early].index_fill(-1, self.eos_ids, float("-inf"))
            scores = torch.cat([forbidden, scores[early:]]) if early < scores.shape[0] else forbidden
        if not self.do_sample:
            return scores
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if self.top_k is not None:
            scores = filter_top_k(scores, self.top_k)
        if self.top_p is not None and self.top_p < 1.0:
            scores = filter_top_p(scores, self.top_p)
        return scores

    def choose(self, scores: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """(B, V) processed scores -> (B,) token ids: the argmax, or a draw from softmax(scores)."""
        if not self.do_sample:
            return scores.argmax(dim=-1)
        return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def _only(scores: Tensor, token_id: int) -> Tensor:
    """Scores (R, V) that allow ``token_id`` alone: 0 for it, -inf for every other token (Hugging Face's
    forced end)."""
    forced = torch.full_like(scores, float("-inf"))
    forced[:, token_id] = 0.0
    return forced
