"""From logits to the next token: the active logits rules (``generation/rules.py``) in their order, then the
argmax, or a draw from the softmax when sampling."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from tformer.generation.rules import RULES, Constrained, LogitsRule, filter_top_k, filter_top_p
from tformer.generation.settings import GenerationConfig

__all__ = ["TokenChooser", "filter_top_k", "filter_top_p"]


@dataclass(frozen=True)
class TokenChooser:
    """How one next token is chosen from a row of logits: ``rules`` (only the active ones, so greedy decoding
    without any costs one ``float()`` a step), then the argmax or, with ``do_sample``, a draw."""

    do_sample: bool = False
    rules: tuple[LogitsRule, ...] = ()
    reads_history: bool = field(init=False)  # a rule needs each row's tokens so far (``scores``' ``history``)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads_history", any(rule.reads_history for rule in self.rules))

    @classmethod
    def from_config(cls, config: GenerationConfig, model_config, device: torch.device | None = None,
                    tokenizer=None) -> TokenChooser:
        """The chooser ``config`` asks for with this model: each rule of ``RULES`` its options turn on (the end
        ids, forced end and suppressed tokens the model config's by default), tensors on ``device``; the
        sampling rules only when sampling; ``tokenizer`` for the rules that read text (a constraint). The one way
        ``generate`` and the serving engine make theirs, so they choose alike."""
        sampling = config.sampling
        made = (kind.from_config(config, model_config, device, **({"tokenizer": tokenizer} if kind.needs_tokenizer
                                                                 else {}))
                for kind in RULES if sampling or not kind.sampling_only)
        return cls(sampling, tuple(rule for rule in made if rule is not None))

    def alters(self, generated: int) -> bool:
        """Whether the token after ``generated`` new ones is anything but the argmax of the logits: sampling, or
        a rule that changes that step's scores (an end id forbidden before ``min_new_tokens``, suppressed
        tokens, the forced last token, a penalty)."""
        if self.do_sample:
            return True
        for rule in self.rules:
            if rule.alters(generated):
                return True
        return False

    def constraint_only(self, generated: int) -> Constrained | None:
        """The constraint rule, when it is the only rule that changes a greedy choice of the token after
        ``generated`` new ones: that token is then the argmax of the logits under its mask
        (``rules.apply_grammar_masks``), which the serving engine applies to many requests' rows at once."""
        if self.do_sample:
            return None
        active = [rule for rule in self.rules if rule.alters(generated)]
        return active[0] if len(active) == 1 and isinstance(active[0], Constrained) else None

    def scores(self, logits: Tensor, generated: int, consecutive: bool = False,
               history: Tensor | None = None) -> Tensor:
        """Processed float scores (R, V) for the token after ``generated`` new ones: the logits through each
        active rule in order (-inf = never chosen).

        ``consecutive``: the rows are successive positions of one sequence, row i coming after
        ``generated + i`` new tokens (speculative decoding's verification). ``history`` (R, L): each row's
        tokens so far, prompt included, needed when ``reads_history`` (a rule that reads them refuses without)."""
        scores = logits.float()
        for rule in self.rules:
            scores = rule(scores, generated, consecutive, history)
        return scores

    def choose(self, scores: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """(B, V) processed scores -> (B,) token ids: the argmax, or a draw from softmax(scores)."""
        if not self.do_sample:
            return scores.argmax(dim=-1)
        return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator).squeeze(-1)
