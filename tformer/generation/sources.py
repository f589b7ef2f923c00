"""An encoder-decoder's sources as ``translate`` and the server both read them, and the room a translation gets:
plain functions over a tokenizer and numbers, without torch, so the server's HTTP process reads prompts with them.
"""

from __future__ import annotations

from collections.abc import Sequence


def translation_budget(longest_source: int, position_limit: int | None) -> int:
    """``new_token_budget`` for a model of ``position_limit`` positions (None: no table)."""
    budget = longest_source * 3 // 2 + 10
    return budget if position_limit is None else max(1, min(budget, position_limit - 1))


def source_end_id(tokenizer, model_config) -> int | None:
    """The token ending every source: the tokenizer's end of sequence, else the model's."""
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model_config.eos_token_id


def encode_sources(tokenizer, texts: Sequence[str], end_id: int | None) -> list[list[int]]:
    """Each text, stripped, as a source: its tokens (no special tokens) and ``end_id``, as the translation task
    trains it."""
    if not texts:
        return []
    encoded = tokenizer.encode_batch([text.strip() for text in texts], add_special_tokens=False)["input_ids"]
    return [[*ids, end_id] if end_id is not None else list(ids) for ids in encoded]
