"""The logits rules: each one small class turning a step's scores into the scores the next token is chosen from,
made from a ``GenerationConfig`` when its option asks for it (``from_config`` returns None otherwise, so a rule
that is off costs nothing per step). ``TokenChooser.from_config`` composes the active ones in ``RULES``' order:
the allowed tokens, the logit biases, the repetition penalty, OpenAI's presence and frequency penalties, the forced
last token, suppressed tokens (always, then at the first new token), end ids forbidden before ``min_new_tokens``
(``stop_token_ids`` among them); then, when sampling, temperature, top-k, top-p and min-p. Each masks or
rescales what Hugging Face's logits processor or warper of the same name does, on logits (greedy, sampling) or
log-probabilities (beam search) alike.

A rule is called as ``rule(scores, generated, consecutive, history)``: ``scores`` (R, V) float, ``generated`` the
new tokens before the first row's token, ``consecutive`` True when the rows are successive positions of one
sequence (row i after ``generated + i`` new tokens: speculative decoding's verification), else the rows are a
batch's sequences all after ``generated``; ``history`` (R, L) the rows' tokens so far (prompt included, -1 at its
left padding), given only when a rule ``reads_history`` and the decoding path has them. A new rule is one class
here plus its place in ``RULES``; its option is one ``GenerationConfig`` field (``settings.py``) declaring the
paths that cannot apply it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from tformer.generation.constraints import grammar_tokenizer, matcher
from tformer.generation.settings import GenerationConfig, GenerationError

NEVER = float("-inf")  # the score of a token that may not be chosen


class LogitsRule:
    """One rule over a step's scores (see the module's docstring)."""

    sampling_only: ClassVar[bool] = False  # applied only when sampling (Hugging Face's warpers)
    reads_history: ClassVar[bool] = False  # needs each row's tokens so far
    needs_tokenizer: ClassVar[bool] = False  # made with the model's tokenizer (``from_config``'s ``tokenizer``)

    @classmethod
    def from_config(cls, config: GenerationConfig, model_config: Any, device: torch.device | None) -> LogitsRule | None:
        """The rule ``config`` asks for with this model, on ``device``; None when its option is off."""
        raise NotImplementedError

    def alters(self, generated: int) -> bool:
        """Whether the scores of the token after ``generated`` new ones may differ from the logits (else a greedy
        choice is the plain argmax)."""
        return True

    def __call__(self, scores: Tensor, generated: int, consecutive: bool, history: Tensor | None) -> Tensor:
        raise NotImplementedError


def _ids(values: tuple[int, ...], device: torch.device | None) -> Tensor | None:
    return torch.tensor(values, dtype=torch.long, device=device) if values else None


class AllowedTokens(LogitsRule):
    """Only the allowed tokens may be chosen (vLLM's ``allowed_token_ids``; Hugging Face's
    ``SuppressTokensLogitsProcessor`` over every other id does the same)."""

    def __init__(self, ids: Tensor) -> None:
        self.ids = ids  # (A,)

    @classmethod
    def from_config(cls, config, model_config, device):
        ids = config.allowed_ids(model_config)
        return None if ids is None else cls(_ids(ids, device))

    def __call__(self, scores, generated, consecutive, history):
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device).index_fill(0, self.ids, True)
        return scores.masked_fill(~allowed, NEVER)


class LogitBias(LogitsRule):
    """Each biased token's score plus its bias (OpenAI's ``logit_bias``; Hugging Face's
    ``SequenceBiasLogitsProcessor`` with one-token sequences)."""

    def __init__(self, ids: Tensor, biases: Tensor) -> None:
        self.ids, self.biases = ids, biases  # (K,) distinct ids, (K,) float

    @classmethod
    def from_config(cls, config, model_config, device):
        ids, biases = config.biased_ids(model_config)
        if not ids:
            return None
        return cls(_ids(ids, device), torch.tensor(biases, dtype=torch.float32, device=device))

    def __call__(self, scores, generated, consecutive, history):
        return scores.index_add(-1, self.ids, self.biases.to(scores.dtype).expand(scores.shape[0], -1))


class RepetitionPenalty(LogitsRule):
    """Tokens already in a row's sequence (prompt and new tokens; not the prompt's left padding, -1 in ``history``,
    as Hugging Face's ``generate`` skips it): positive scores divided by the penalty, negative ones multiplied
    (Hugging Face's ``RepetitionPenaltyLogitsProcessor``)."""

    reads_history = True

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    @classmethod
    def from_config(cls, config, model_config, device):
        return cls(float(config.repetition_penalty)) if config.repetition_penalty != 1.0 else None

    def __call__(self, scores, generated, consecutive, history):
        if history is None or consecutive:  # fail closed: a path that cannot give each row's tokens so far
            raise GenerationError("repetition_penalty needs each row's tokens so far, which this decoding path does "
                                  "not give; pass repetition_penalty=1.0")
        vocab = scores.shape[-1]
        # Padding (-1) and ids past the scores (never chosen) land in an extra column, dropped.
        ids = history.masked_fill(history < 0, vocab).clamp(max=vocab)
        seen = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
        seen.scatter_(1, ids, True)
        penalised = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return torch.where(seen[:, :vocab], penalised, scores)


class PresenceFrequencyPenalty(LogitsRule):
    """OpenAI's penalties over a row's new tokens (not its prompt): each token's score minus ``frequency`` times
    the times it was chosen so far and minus ``presence`` once it was (OpenAI's definition; vLLM's
    ``apply_penalties``). Hugging Face has no such processor."""

    reads_history = True

    def __init__(self, presence: float, frequency: float) -> None:
        self.presence, self.frequency = presence, frequency

    @classmethod
    def from_config(cls, config, model_config, device):
        if config.presence_penalty == 0 and config.frequency_penalty == 0:
            return None
        return cls(float(config.presence_penalty), float(config.frequency_penalty))

    def alters(self, generated):
        return generated > 0  # nothing chosen yet: nothing to penalise

    def __call__(self, scores, generated, consecutive, history):
        if history is None or consecutive:  # fail closed: a path that cannot give each row's tokens so far
            raise GenerationError("presence_penalty and frequency_penalty need each row's tokens so far, which this "
                                  "decoding path does not give; pass 0.0 for both")
        if generated == 0:
            return scores
        rows, vocab = scores.shape
        new = history[:, history.shape[1] - generated:]  # (R, G) the new tokens, the last G of each row
        # Ids past the scores (never chosen) land in an extra column, dropped.
        ids = new.masked_fill(new < 0, vocab).clamp(max=vocab)
        counts = torch.zeros(rows, vocab + 1, dtype=scores.dtype, device=scores.device)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=scores.dtype))
        counts = counts[:, :vocab]  # (R, V) times each token was chosen
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


class ForcedEnd(LogitsRule):
    """The token after ``max_new_tokens - 1`` new ones is the forced end alone (Hugging Face's
    ``ForcedEOSTokenLogitsProcessor``: 0 for it, -inf for every other token)."""

    def __init__(self, token_id: int, max_new_tokens: int) -> None:
        self.token_id, self.max_new_tokens = token_id, max_new_tokens

    @classmethod
    def from_config(cls, config, model_config, device):
        forced = config.forced_end_id(model_config)
        return None if forced is None else cls(forced, config.max_new_tokens)

    def alters(self, generated):
        return generated == self.max_new_tokens - 1

    def __call__(self, scores, generated, consecutive, history):
        last = self.max_new_tokens - 1 - generated  # the row that chooses the last token allowed
        if consecutive and 0 <= last < scores.shape[0]:
            return torch.cat([scores[:last], self._only(scores[last:last + 1]), scores[last + 1:]])
        if not consecutive and last == 0:
            return self._only(scores)
        return scores

    def _only(self, scores: Tensor) -> Tensor:
        forced = torch.full_like(scores, NEVER)
        forced[:, self.token_id] = 0.0
        return forced


class Suppress(LogitsRule):
    """Tokens never chosen (Hugging Face's ``SuppressTokensLogitsProcessor``)."""

    def __init__(self, ids: Tensor) -> None:
        self.ids = ids  # (S,)

    @classmethod
    def from_config(cls, config, model_config, device):
        ids = _ids(config.suppressed_ids(model_config)[0], device)
        return None if ids is None else cls(ids)

    def __call__(self, scores, generated, consecutive, history):
        return scores.index_fill(-1, self.ids, NEVER)


class BeginSuppress(LogitsRule):
    """Tokens not chosen as the first new one (Hugging Face's ``SuppressTokensAtBeginLogitsProcessor``)."""

    def __init__(self, ids: Tensor) -> None:
        self.ids = ids  # (S,)

    @classmethod
    def from_config(cls, config, model_config, device):
        ids = _ids(config.suppressed_ids(model_config)[1], device)
        return None if ids is None else cls(ids)

    def alters(self, generated):
        return generated == 0

    def __call__(self, scores, generated, consecutive, history):
        if generated != 0:
            return scores
        if consecutive:  # only the first row chooses the first new token
            return torch.cat([scores[:1].index_fill(-1, self.ids, NEVER), scores[1:]])
        return scores.index_fill(-1, self.ids, NEVER)


class MinNewTokens(LogitsRule):
    """End ids forbidden before ``min_new_tokens`` new ones (Hugging Face's ``MinNewTokensLengthLogitsProcessor``)."""

    def __init__(self, end_ids: Tensor, min_new_tokens: int) -> None:
        self.end_ids, self.min_new_tokens = end_ids, min_new_tokens  # (E,)

    @classmethod
    def from_config(cls, config, model_config, device):
        end_ids = _ids(config.end_ids(model_config), device)
        return None if end_ids is None or config.min_new_tokens == 0 else cls(end_ids, config.min_new_tokens)

    def alters(self, generated):
        return generated < self.min_new_tokens

    def __call__(self, scores, generated, consecutive, history):
        if generated >= self.min_new_tokens:
            return scores
        early = self.min_new_tokens - generated if consecutive else scores.shape[0]
        forbidden = scores[:early].index_fill(-1, self.end_ids, NEVER)
        return torch.cat([forbidden, scores[early:]]) if early < scores.shape[0] else forbidden


class Temperature(LogitsRule):
    """Scores divided by the temperature (Hugging Face's ``TemperatureLogitsWarper``)."""

    sampling_only = True

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    @classmethod
    def from_config(cls, config, model_config, device):
        return cls(float(config.temperature)) if config.temperature != 1.0 else None

    def __call__(self, scores, generated, consecutive, history):
        return scores / self.temperature


def filter_top_k(logits: Tensor, top_k: int) -> Tensor:
    """Keep the ``top_k`` largest logits of each row (B, V) (ties with the k-th kept too); -inf elsewhere."""
    if top_k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, NEVER)


def filter_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most probable tokens whose probability reaches ``top_p`` (nucleus)."""
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probabilities = sorted_logits.softmax(-1)
    # A token is dropped when the tokens before it already reach top_p; the top one always stays.
    drop_sorted = (probabilities.cumsum(-1) - probabilities) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEVER)


class TopK(LogitsRule):
    """The ``top_k`` best tokens of each row (``filter_top_k``)."""

    sampling_only = True

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k

    @classmethod
    def from_config(cls, config, model_config, device):
        return None if config.top_k is None else cls(config.top_k)

    def __call__(self, scores, generated, consecutive, history):
        return filter_top_k(scores, self.top_k)


class TopP(LogitsRule):
    """The nucleus of mass ``top_p`` (``filter_top_p``); ``top_p`` 1 cuts nothing."""

    sampling_only = True

    def __init__(self, top_p: float) -> None:
        self.top_p = top_p

    @classmethod
    def from_config(cls, config, model_config, device):
        return None if config.top_p is None or config.top_p >= 1.0 else cls(float(config.top_p))

    def __call__(self, scores, generated, consecutive, history):
        return filter_top_p(scores, self.top_p)


class MinP(LogitsRule):
    """Tokens less probable than ``min_p`` times the row's most probable token dropped (Hugging Face's
    ``MinPLogitsWarper``; the most probable token always stays, so its ``min_tokens_to_keep`` of 1 is implied)."""

    sampling_only = True

    def __init__(self, min_p: float) -> None:
        self.min_p = min_p

    @classmethod
    def from_config(cls, config, model_config, device):
        return None if config.min_p is None or config.min_p == 0 else cls(float(config.min_p))

    def __call__(self, scores, generated, consecutive, history):
        probabilities = scores.softmax(-1)
        threshold = self.min_p * probabilities.amax(-1, keepdim=True)  # <= the top probability: it stays
        return scores.masked_fill(probabilities < threshold, NEVER)


class Constrained(LogitsRule):
    """Only the tokens that keep the new text inside the ``constraint`` (``constraints.py``: a JSON schema, a
    regex, ...), and once the text is complete only an end id (the grammar engine's mask). Each row's grammar
    state is found from its new tokens (``history``'s last ``generated`` columns), so the rule follows any batch:
    ``generate``'s rows, and a serving request's sequences scored one at a time. A row whose grammar state broke
    (a finished row's padding after its end id, or a token a rule after this one forced) is left as it is from
    then on, and so is a row where the rules before leave no token the grammar allows (the forced last token at
    the length limit cuts the text there, as the limit does)."""

    reads_history = True
    needs_tokenizer = True

    def __init__(self, start) -> None:
        self.start = start  # the grammar engine's matcher before any token (``constraints.matcher``)
        self.states: dict[tuple[int, ...], Any] = {}  # a row's new tokens -> its matcher after them

    @classmethod
    def from_config(cls, config, model_config, device, tokenizer=None):
        if config.constraint is None:
            return None
        vocabulary = grammar_tokenizer(tokenizer, model_config.vocab_size, config.end_ids(model_config))
        return cls(matcher(config.constraint, vocabulary))

    def __call__(self, scores, generated, consecutive, history):
        if history is None or consecutive:  # fail closed: the grammar state needs each row's own tokens
            raise GenerationError("a constraint needs each row's tokens so far, which this decoding path does not "
                                  "give; decode without a draft model and with num_beams=1")
        rows = scores.shape[0]
        new_tokens = history[:, history.shape[1] - generated:].tolist() if generated else [[] for _ in range(rows)]
        return apply_grammar_masks(scores, [self.mask_after(tuple(tokens)) for tokens in new_tokens])

    def mask_after(self, tokens: tuple[int, ...]) -> bytes | None:
        """The grammar engine's bitmask of the tokens that may follow a row's new ``tokens`` (one bit a token of its
        vocabulary, little-endian, in 32-bit words); None once the row has broken the grammar."""
        state = self._state_after(tokens)
        return None if state is None else state.compute_bitmask()

    def _state_after(self, tokens: tuple[int, ...]):
        """The matcher of a row whose new tokens are ``tokens``: the one kept for them, else the one kept for all
        but the last advanced by it, else a fresh one advanced through all (a row seen for the first time, or one
        of a request's sequences parting from a sibling); None once it has refused a token."""
        state = self.states.pop(tokens, None)
        if state is None:
            before = self.states.pop(tokens[:-1], None) if tokens else None
            state, fed = (before, tokens[-1:]) if before is not None else (self.start.deep_copy(), tokens)
            for token in fed:
                if not state.consume_token(token):  # an error state, kept
                    break
        self.states[tokens] = state
        return None if state.is_error() else state


def apply_grammar_masks(scores: Tensor, masks: list[bytes | None]) -> Tensor:
    """Scores (R, V) with each row's tokens outside its grammar bitmask (``Constrained.mask_after``) set to NEVER; a
    row without a mask (None), or whose mask allows none of the tokens its scores still allow, left as it is."""
    if all(mask is None for mask in masks):
        return scores
    rows, vocab = scores.shape
    width = len(next(mask for mask in masks if mask is not None))  # the grammar's vocabulary may be padded past V
    packed = np.frombuffer(b"".join(b"\xff" * width if mask is None else mask for mask in masks),
                           dtype=np.uint8).reshape(rows, width)
    allowed = torch.from_numpy(np.unpackbits(packed, axis=1, count=vocab, bitorder="little").view(np.bool_))
    masked = scores.masked_fill(~allowed.to(scores.device), NEVER)  # (R, V)
    keeps_some = (masked > NEVER).any(-1, keepdim=True)  # (R, 1)
    return masked if bool(keeps_some.all()) else torch.where(keeps_some, masked, scores)


# The rules in the order they apply (Hugging Face's: processors, then the sampling warpers).
# The allowed tokens and the biases come first, as vLLM applies them before its penalties and Hugging Face its
# sequence bias before its repetition penalty.
RULES: tuple[type[LogitsRule], ...] = (AllowedTokens, LogitBias, RepetitionPenalty, PresenceFrequencyPenalty,
                                       ForcedEnd, Suppress, BeginSuppress, MinNewTokens, Constrained,
                                       Temperature, TopK, TopP, MinP)
