"""The arguments of ``generate``, checked once where they enter, with defaults resolved from the
model's config. Every problem is a ``GenerationError`` naming the argument and what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.errors import TformerError


class GenerationError(TformerError):
    """An argument of ``generate`` is invalid; the message names it and what is allowed."""


@dataclass(frozen=True)
class GenerationSettings:
    """Everything a decoding strategy needs to know besides the model and the prompt."""

    max_new_tokens: int
    min_new_tokens: int
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int | None
    eos_ids: tuple[int, ...]
    pad_id: int
    stop_strings: tuple[str, ...]
    tokenizer: object | None
    num_beams: int
    length_penalty: float
    early_stopping: bool | str
    num_return_sequences: int
    num_draft_tokens: int
    output_scores: bool
    use_cache: bool


def check_model(model: object, role: str = "model") -> None:
    """A model ``generate`` can decode: a tformer decoder (encoder-decoders will join)."""
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config is None or not hasattr(model, "new_cache"):
        raise GenerationError(f"{role} must be a tformer decoder model (DecoderLM), got {type(model).__name__}")
    if config.architecture != "decoder":
        raise GenerationError(f"{role} has architecture={config.architecture!r}; generate supports: decoder")


def check_prompt(model: nn.Module, input_ids: object, attention_mask: object) -> None:
    """``input_ids`` (B, T) token ids of the model's vocabulary; ``attention_mask`` left padding."""
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
    if bool((mask[:, 1:] < mask[:, :-1]).any()):
        row = int((mask[:, 1:] < mask[:, :-1]).any(-1).nonzero()[0])
        raise GenerationError(
            f"attention_mask row {row} is not left-padded: padding (0) must come before the tokens (1)"
        )


def resolve_settings(
    model: nn.Module,
    input_ids: Tensor,
    *,
    max_new_tokens: object,
    min_new_tokens: object,
    do_sample: object,
    temperature: object,
    top_k: object,
    top_p: object,
    seed: object,
    eos_token_id: object,
    pad_token_id: object,
    stop_strings: object,
    tokenizer: object,
    num_beams: object,
    length_penalty: object,
    early_stopping: object,
    num_return_sequences: object,
    draft_model: object,
    num_draft_tokens: object,
    streaming: bool,
    output_scores: bool,
    use_cache: bool,
) -> GenerationSettings:
    """Check every argument and fill in defaults (end-of-sequence and pad ids from the config)."""
    config = model.config
    _require_int("max_new_tokens", max_new_tokens, 0)
    _require_int("min_new_tokens", min_new_tokens, 0)
    if min_new_tokens > max_new_tokens:
        raise GenerationError(f"min_new_tokens={min_new_tokens} exceeds max_new_tokens={max_new_tokens}")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
        raise GenerationError(f"temperature={temperature!r} must be a number >= 0 (0 = greedy)")
    if top_k is not None:
        _require_int("top_k", top_k, 1)
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise GenerationError(f"top_p={top_p!r} must be a number in (0, 1]")
    if seed is not None:
        _require_int("seed", seed, 0)
    if do_sample is None:
        do_sample = temperature != 1.0 or top_k is not None or top_p is not None
    if not isinstance(do_sample, bool):
        raise GenerationError(f"do_sample={do_sample!r} must be True, False or None")
    if temperature == 0:
        do_sample = False

    eos_ids = _token_ids("eos_token_id", config.eos_token_id if eos_token_id is None else eos_token_id,
                         config.vocab_size)
    if pad_token_id is None:
        pad_token_id = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    if not isinstance(pad_token_id, int) or isinstance(pad_token_id, bool):
        raise GenerationError(f"pad_token_id={pad_token_id!r} must be one token id")
    (pad_id,) = _token_ids("pad_token_id", pad_token_id, config.vocab_size)

    stops = _stop_strings(stop_strings)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if stops and tokenizer is None:
        raise GenerationError("stop_strings need a tokenizer: pass tokenizer= or attach one to the model")

    _require_int("num_beams", num_beams, 1)
    _require_int("num_return_sequences", num_return_sequences, 1)
    if not isinstance(length_penalty, (int, float)) or isinstance(length_penalty, bool):
        raise GenerationError(f"length_penalty={length_penalty!r} must be a number")
    if not (isinstance(early_stopping, bool) or early_stopping == "never"):
        raise GenerationError(f"early_stopping={early_stopping!r} must be True, False or 'never'")
    if num_beams > 1:
        if do_sample:
            raise GenerationError(
                "sampling (do_sample, temperature, top_k, top_p) cannot be combined with num_beams > 1"
            )
        if num_return_sequences > num_beams:
            raise GenerationError(
                f"num_return_sequences={num_return_sequences} exceeds num_beams={num_beams}; "
                "beam search returns at most num_beams sequences"
            )
        if streaming:
            raise GenerationError("streaming needs num_beams=1: beam search only knows its sequences at the end")
    elif num_return_sequences > 1 and not do_sample:
        raise GenerationError(
            f"num_return_sequences={num_return_sequences} needs sampling (do_sample=True) or beam search "
            "(num_beams >= num_return_sequences); greedy decoding has one answer"
        )

    _require_int("num_draft_tokens", num_draft_tokens, 1)
    if draft_model is not None:
        check_model(draft_model, role="draft_model")
        if draft_model.config.vocab_size != config.vocab_size:
            raise GenerationError(
                f"draft_model has vocab_size={draft_model.config.vocab_size}, the model {config.vocab_size}; "
                "speculative decoding needs the same vocabulary"
            )
        if num_beams > 1:
            raise GenerationError("speculative decoding (draft_model) cannot be combined with num_beams > 1")
        if input_ids.shape[0] * num_return_sequences != 1:
            raise GenerationError(
                f"speculative decoding (draft_model) takes one sequence at a time; got batch size "
                f"{input_ids.shape[0]} x num_return_sequences {num_return_sequences}"
            )
        if not use_cache:
            raise GenerationError("speculative decoding (draft_model) needs use_cache=True")

    for role, checked in (("model", model), ("draft_model", draft_model)):
        if checked is not None:
            _check_length(checked, role, input_ids.shape[1], max_new_tokens)

    return GenerationSettings(
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=do_sample,
        temperature=float(temperature), top_k=top_k, top_p=None if top_p is None else float(top_p), seed=seed,
        eos_ids=eos_ids, pad_id=pad_id, stop_strings=stops, tokenizer=tokenizer, num_beams=num_beams,
        length_penalty=float(length_penalty), early_stopping=early_stopping,
        num_return_sequences=num_return_sequences, num_draft_tokens=num_draft_tokens,
        output_scores=bool(output_scores), use_cache=bool(use_cache),
    )


def _require_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise GenerationError(f"{name}={value!r} must be an integer >= {minimum}")


def _token_ids(name: str, value: object, vocab_size: int) -> tuple[int, ...]:
    """One id or several as a tuple, each checked against the vocabulary."""
    if value is None:
        return ()
    ids = [value] if isinstance(value, int) else value
    if isinstance(ids, Tensor):
        ids = ids.flatten().tolist()
    if not isinstance(ids, Sequence) or isinstance(ids, str):
        raise GenerationError(f"{name}={value!r} must be a token id or a list of token ids")
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
            raise GenerationError(f"{name}={value!r}: {token!r} is not a token id in [0, {vocab_size})")
    return tuple(ids)


def _stop_strings(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    strings = (value,) if isinstance(value, str) else value
    if not isinstance(strings, Sequence) or not all(isinstance(s, str) and s for s in strings):
        raise GenerationError(f"stop_strings={value!r} must be a non-empty string or a list of them")
    return tuple(strings)


def _check_length(model: nn.Module, role: str, prompt_length: int, max_new_tokens: int) -> None:
    """Models with a position table cannot go past ``max_seq_len`` positions."""
    limit = model.position_limit
    if limit is not None and prompt_length + max_new_tokens > limit:
        raise GenerationError(
            f"prompt ({prompt_length} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"max_seq_len={limit} of this {role}'s {model.config.positional} position table"
        )
