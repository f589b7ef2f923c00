"""The options of ``generate`` as one frozen ``GenerationConfig``, checked where they enter, and
the checks that need the model (token ids against its vocabulary, the draft model). Every
problem is a ``GenerationError`` naming the option and what is allowed.

A new option is one field of ``GenerationConfig`` plus its check in ``_check``: ``generate``,
``stream_generate`` and the command line all take the config as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.errors import TformerError

HOOKS = ("config", "prepare_generation", "new_cache", "position_limit")  # what a model offers generation


class GenerationError(TformerError):
    """An argument of ``generate`` is invalid; the message names it and what is allowed."""


@dataclass(frozen=True)
class GenerationConfig:
    """Every option of one ``generate`` call (Hugging Face's ``GenerationConfig`` names, where one exists).

    Checked and normalised when made (token-id lists and stop strings become tuples);
    ``replace`` makes a changed copy. Options that depend on the model (end ids within its
    vocabulary, its default end and pad ids) are resolved per call by ``end_ids``/``pad_id``.
    """

    max_new_tokens: int = 32
    # The whole sequence's length limit, prompt included (Hugging Face's max_length, from a folder's
    # generation_config.json): when set, max_new_tokens is what the prompt leaves of it.
    max_length: int | None = None
    min_new_tokens: int = 0  # end ids are forbidden before this many new tokens
    forced_eos_token_id: int | bool | None = None  # the last token a row may have; None: the model config's,
    # False: none
    do_sample: bool | None = None  # None: sample when temperature != 1, top_k or top_p say so
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None  # None: the model config's; () never ends early
    pad_token_id: int | None = None  # None: the model config's, else the first end id
    stop_strings: str | tuple[str, ...] = ()
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never"
    num_return_sequences: int = 1
    num_draft_tokens: int = 4  # speculative decoding: tokens the draft model proposes per round
    output_scores: bool = False
    return_dict: bool = False
    use_cache: bool = True  # False re-runs the whole sequence each step (the slow reference)
    # Tokens never chosen, and tokens not chosen as the first new one (None: the model config's; () none).
    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = None
    # An encoder-decoder's (a speech model's) first decoder tokens for every row, in place of its start token:
    # Whisper's <|startoftranscript|>, language, task, <|notimestamps|> (tformer.models.speech.whisper_prompt).
    decoder_prompt_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self._check()

    def replace(self, **changes: object) -> GenerationConfig:
        """A checked copy with ``changes``; an unknown option is a TypeError that lists the known ones."""
        known = {field.name for field in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown generation option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **changes)

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn (else the argmax): ``do_sample``, or implied by the sampling options."""
        if self.temperature == 0:
            return False
        if self.do_sample is None:
            return self.temperature != 1.0 or self.top_k is not None or self.top_p is not None
        return self.do_sample

    def for_prompt(self, prompt_length: int) -> GenerationConfig:
        """This config with ``max_length`` turned into ``max_new_tokens`` for a decoder prompt of
        ``prompt_length`` tokens (unchanged without ``max_length``)."""
        if self.max_length is None:
            return self
        if self.max_length <= prompt_length:
            raise GenerationError(f"max_length={self.max_length} leaves no new token after a {prompt_length}-token "
                                  "prompt; pass max_new_tokens")
        return dataclasses.replace(self, max_new_tokens=self.max_length - prompt_length, max_length=None)

    def end_ids(self, model_config) -> tuple[int, ...]:
        """The end-of-sequence ids, the model config's by default (all of a list), each within its vocabulary."""
        value = self.eos_token_id
        if value is None:  # a Llama 3 config.json's list is kept whole in extra (eos_token_id holds its first)
            value = getattr(model_config, "extra", {}).get("eos_token_ids", model_config.eos_token_id)
        return _token_ids("eos_token_id", value, model_config.vocab_size)

    def forced_end_id(self, model_config) -> int | None:
        """The token a row that reaches ``max_new_tokens`` must end with (the option, else the model config's
        ``forced_eos_token_id``), or None."""
        value = getattr(model_config, "forced_eos_token_id", None) if self.forced_eos_token_id is None \
            else self.forced_eos_token_id
        if value is False or value is None:
            return None
        (forced_id,) = _token_ids("forced_eos_token_id", value, model_config.vocab_size)
        return forced_id

    def suppressed_ids(self, model_config) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids never chosen and the ids not chosen first: the options, else the model config's, each within
        its vocabulary."""
        found = []
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            value = getattr(self, name)
            found.append(_token_ids(name, getattr(model_config, name, ()) if value is None else value,
                                    model_config.vocab_size))
        return found[0], found[1]

    def pad_id(self, model_config) -> int:
        """The id finished rows are filled with: the option, the config's, else the first end id, else 0."""
        value = self.pad_token_id
        if value is None:
            end_ids = self.end_ids(model_config)
            value = model_config.pad_token_id if model_config.pad_token_id is not None else (end_ids[0] if end_ids
                                                                                             else 0)
        (pad_id,) = _token_ids("pad_token_id", value, model_config.vocab_size)
        return pad_id

    # ---- the checks, one per option ------------------------------------------------------------

    def _check(self) -> None:
        _require_int("max_new_tokens", self.max_new_tokens, 0)
        _require_int("min_new_tokens", self.min_new_tokens, 0)
        if self.max_length is not None:
            _require_int("max_length", self.max_length, 1)
        forced = self.forced_eos_token_id
        if forced is not None and forced is not False and (isinstance(forced, bool) or not isinstance(forced, int)):
            raise GenerationError(f"forced_eos_token_id={forced!r} must be a token id, None (the model config's) "
                                  "or False (none)")
        if self.min_new_tokens > self.max_new_tokens:
            raise GenerationError(f"min_new_tokens={self.min_new_tokens} exceeds max_new_tokens={self.max_new_tokens}")
        if self.do_sample is not None and not isinstance(self.do_sample, bool):
            raise GenerationError(f"do_sample={self.do_sample!r} must be True, False or None")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise GenerationError(f"temperature={self.temperature!r} must be a number >= 0 (0 = greedy)")
        if self.top_k is not None:
            _require_int("top_k", self.top_k, 1)
        if self.top_p is not None and (not _is_number(self.top_p) or not 0 < self.top_p <= 1):
            raise GenerationError(f"top_p={self.top_p!r} must be a number in (0, 1]")
        if self.seed is not None:
            _require_int("seed", self.seed, 0)
            if self.seed >= 2**64:
                raise GenerationError(f"seed={self.seed} must be below 2**64 (a generator's seed is 64 bits)")
        if self.eos_token_id is not None and not isinstance(self.eos_token_id, int):  # several: a tuple
            self._normalise("eos_token_id", _token_ids("eos_token_id", self.eos_token_id, None))
        elif self.eos_token_id is not None:
            _token_ids("eos_token_id", self.eos_token_id, None)
        if self.pad_token_id is not None and (not isinstance(self.pad_token_id, int)
                                              or isinstance(self.pad_token_id, bool)):
            raise GenerationError(f"pad_token_id={self.pad_token_id!r} must be one token id")
        self._normalise("stop_strings", _stop_strings(self.stop_strings))
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            if getattr(self, name) is not None:
                self._normalise(name, _token_ids(name, list(getattr(self, name)), None))
        self._normalise("decoder_prompt_ids", _token_ids("decoder_prompt_ids", list(self.decoder_prompt_ids or ()),
                                                         None))
        _require_int("num_beams", self.num_beams, 1)
        _require_int("num_return_sequences", self.num_return_sequences, 1)
        if not _is_number(self.length_penalty):
            raise GenerationError(f"length_penalty={self.length_penalty!r} must be a number")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise GenerationError(f"early_stopping={self.early_stopping!r} must be True, False or 'never'")
        if self.num_beams > 1:
            if self.sampling:
                raise GenerationError(
                    "sampling (do_sample, temperature, top_k, top_p) cannot be combined with num_beams > 1"
                )
            if self.num_return_sequences > self.num_beams:
                raise GenerationError(
                    f"num_return_sequences={self.num_return_sequences} exceeds num_beams={self.num_beams}; "
                    "beam search returns at most num_beams sequences"
                )
        elif self.num_return_sequences > 1 and not self.sampling:
            raise GenerationError(
                f"num_return_sequences={self.num_return_sequences} needs sampling (do_sample=True) or beam search "
                "(num_beams >= num_return_sequences); greedy decoding has one answer"
            )
        _require_int("num_draft_tokens", self.num_draft_tokens, 1)
        for name in ("output_scores", "return_dict", "use_cache"):
            if not isinstance(getattr(self, name), bool):
                raise GenerationError(f"{name}={getattr(self, name)!r} must be True or False")

    def _normalise(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # frozen: set once, while being made


def check_model(model: object, role: str = "model") -> None:
    """A model ``generate`` can decode: a module offering the generation hooks (see ``session``)."""
    missing = [hook for hook in HOOKS if not hasattr(model, hook)] if isinstance(model, nn.Module) else list(HOOKS)
    if missing:
        raise GenerationError(
            f"{role} must be a tformer model with the generation hooks {', '.join(HOOKS)}; "
            f"{type(model).__name__} lacks {', '.join(missing)}"
        )


def check_prompt(model: nn.Module, input_ids: object, attention_mask: object) -> None:
    """``input_ids`` (B, T) token ids of the model's vocabulary; ``attention_mask`` left padding (a
    decoder continues its prompt), or either side for a model whose ``encodes_prompt`` is True. A model whose
    prompt is not token ids (a speech model's log-mel features) checks it with its ``check_generation_input``."""
    own_check = getattr(model, "check_generation_input", None)
    if own_check is not None:
        problem = own_check(input_ids, attention_mask)
        if problem is not None:
            raise GenerationError(problem)
        return
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise GenerationError(f"input_ids must be a tensor of shape (batch, length >= 1), got {shape}")
    if input_ids.shape[0] == 0:
        raise GenerationError("input_ids has no rows (batch size 0)")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int16, torch.uint8):
        raise GenerationError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    vocab = model.config.vocab_size
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise GenerationError(f"token id {bad} in input_ids is outside the vocabulary [0, {vocab})")
    if attention_mask is None:
        return
    if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise GenerationError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {shape}")
    mask = attention_mask.long()
    if bool(((mask != 0) & (mask != 1)).any()):
        raise GenerationError("attention_mask must hold only 0 (padding) and 1 (token)")
    if bool((mask.sum(-1) == 0).any()):
        raise GenerationError(f"attention_mask row {int((mask.sum(-1) == 0).nonzero()[0])} has no token")
    if getattr(model, "encodes_prompt", False):  # a source for an encoder: padded on either side
        return
    if bool((mask[:, 1:] < mask[:, :-1]).any()):
        row = int((mask[:, 1:] < mask[:, :-1]).any(-1).nonzero()[0])
        raise GenerationError(
            f"attention_mask row {row} is not left-padded: padding (0) must come before the tokens (1)"
        )


def check_call(
    config: GenerationConfig,
    model: nn.Module,
    input_ids: Tensor,
    draft_model: nn.Module | None,
    tokenizer: object | None,
    streaming: bool,
) -> None:
    """The checks that need more than the options: the model's vocabulary, a tokenizer for stop
    strings, streaming, and what speculative decoding needs of its draft model."""
    config.pad_id(model.config)  # checks the end and pad ids against the vocabulary
    config.suppressed_ids(model.config)
    if config.decoder_prompt_ids:
        if not getattr(model, "encodes_prompt", False):
            raise GenerationError("decoder_prompt_ids are an encoder-decoder's first decoder tokens; a decoder's "
                                  "prompt is its input_ids")
        _token_ids("decoder_prompt_ids", config.decoder_prompt_ids, model.config.vocab_size)
    if config.stop_strings and tokenizer is None:
        raise GenerationError("stop_strings need a tokenizer: pass tokenizer= or attach one to the model")
    if streaming and config.num_beams > 1:
        raise GenerationError("streaming needs num_beams=1: beam search only knows its sequences at the end")
    if draft_model is None:
        return
    check_model(draft_model, role="draft_model")
    if draft_model.config.vocab_size != model.config.vocab_size:
        raise GenerationError(
            f"draft_model has vocab_size={draft_model.config.vocab_size}, the model {model.config.vocab_size}; "
            "speculative decoding needs the same vocabulary"
        )
    if config.num_beams > 1:
        raise GenerationError("speculative decoding (draft_model) cannot be combined with num_beams > 1")
    if input_ids.shape[0] * config.num_return_sequences != 1:
        raise GenerationError(
            f"speculative decoding (draft_model) takes one sequence at a time; got batch size "
            f"{input_ids.shape[0]} x num_return_sequences {config.num_return_sequences}"
        )
    if not config.use_cache:
        raise GenerationError("speculative decoding (draft_model) needs use_cache=True")


def _is_number(value: object) -> bool:
    """A finite int or float (NaN and infinities are refused: no option means anything with them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _require_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise GenerationError(f"{name}={value!r} must be an integer >= {minimum}")


def _token_ids(name: str, value: object, vocab_size: int | None) -> tuple[int, ...]:
    """One id or several as a tuple, each checked against the vocabulary (when known)."""
    if value is None:
        return ()
    ids = [value] if isinstance(value, int) else value
    if isinstance(ids, Tensor):
        ids = ids.flatten().tolist()
    if not isinstance(ids, Sequence) or isinstance(ids, str):
        raise GenerationError(f"{name}={value!r} must be a token id or a list of token ids")
    upper = float("inf") if vocab_size is None else vocab_size
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < upper:
            allowed = "a token id >= 0" if vocab_size is None else f"a token id in [0, {vocab_size})"
            raise GenerationError(f"{name}={value!r}: {token!r} is not {allowed}")
    return tuple(ids)


def _stop_strings(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    strings = (value,) if isinstance(value, str) else value
    if not isinstance(strings, Sequence) or not all(isinstance(s, str) and s for s in strings):
        raise GenerationError(f"stop_strings={value!r} must be a non-empty string or a list of them")
    return tuple(strings)
