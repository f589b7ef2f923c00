"""``generate``: decode new tokens from a decoder model with a preallocated key/value cache."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.generation.sampling import next_token


@torch.inference_mode()
def generate(
    model,
    input_ids: Tensor,
    max_new_tokens: int = 32,
    *,
    attention_mask: Tensor | None = None,
    do_sample: bool | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    seed: int | None = None,
) -> Tensor:
    """Continue each prompt of ``input_ids`` (B, T) by up to ``max_new_tokens`` tokens.

    Greedy unless ``do_sample`` (which defaults to True when a temperature other than 1,
    ``top_k`` or ``top_p`` is given); ``temperature=0`` is greedy. Prompts of different
    lengths are left-padded with ``attention_mask`` (B, T) marking real tokens with 1.
    Returns (B, T + new): rows that stop at ``eos_token_id`` are padded with it.
    """
    _check_arguments(model, input_ids, max_new_tokens, temperature, top_k, top_p)
    if do_sample is None:
        do_sample = temperature != 1.0 or top_k is not None or top_p is not None
    if temperature == 0:
        do_sample = False
    generator = None
    if seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    eos_ids = _as_id_tensor(eos_token_id, input_ids.device)

    was_training = model.training
    model.eval()
    batch, prompt_len = input_ids.shape
    total = prompt_len + max_new_tokens
    cache = model.new_cache(batch, total)
    mask = None if attention_mask is None else torch.ones(batch, total, dtype=torch.long, device=input_ids.device)
    if mask is not None:
        mask[:, :prompt_len] = attention_mask
    output = torch.empty(batch, total, dtype=torch.long, device=input_ids.device)
    output[:, :prompt_len] = input_ids
    finished = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)

    step_input = input_ids
    length = prompt_len
    try:
        for _ in range(max_new_tokens):
            logits = model(
                step_input, attention_mask=None if mask is None else mask[:, :length], cache=cache
            ).logits[:, -1]
            token = next_token(logits, do_sample, temperature, top_k, top_p, generator)
            if eos_ids is not None:
                token = torch.where(finished, eos_ids[0], token)
                finished |= torch.isin(token, eos_ids)
            output[:, length] = token
            length += 1
            step_input = token[:, None]
            if eos_ids is not None and bool(finished.all()):
                break
    finally:
        model.train(was_training)
    return output[:, :length]


def _as_id_tensor(ids: int | list[int] | None, device) -> Tensor | None:
    if ids is None:
        return None
    return torch.tensor([ids] if isinstance(ids, int) else list(ids), device=device)


def _check_arguments(model, input_ids: Tensor, max_new_tokens: int, temperature, top_k, top_p) -> None:
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must have shape (batch, length >= 1), got {tuple(input_ids.shape)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a non-negative integer")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    limit = model.config.max_seq_len if model.positional.has_table else None
    if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"max_seq_len={limit} of this model"
        )
