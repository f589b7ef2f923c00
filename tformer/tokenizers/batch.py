"""What ``encode_batch`` returns, and the truncation and padding that make a batch rectangular.
Keys follow the ecosystem: ``input_ids``, ``attention_mask`` (1 = attend), ``token_type_ids``,
so ``model(**batch)`` works."""

from __future__ import annotations

from typing import Any

from tformer.tokenizers.errors import TokenizerError

PADDING_CHOICES = (False, True, "longest", "max_length", "do_not_pad")
SIDES = ("left", "right")
TENSOR_KINDS = (None, "pt", "np")


class BatchEncoding(dict):
    """A dict of equal-length lists (or tensors) with attribute access: ``batch.input_ids``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"this batch has no {name!r}; it has {', '.join(self)}") from None

    def to(self, device) -> BatchEncoding:
        """The same batch with its tensors moved to ``device``."""
        return BatchEncoding({key: value.to(device) if hasattr(value, "to") else value for key, value in self.items()})


def truncate_pair(
    ids_a: list[int], ids_b: list[int] | None, budget: int, side: str
) -> tuple[list[int], list[int] | None]:
    """Cut ``ids_a`` (+ ``ids_b``) to ``budget`` tokens in all, from the end (``side="right"``)
    or the start. A pair is cut "longest first" as Hugging Face does: the shorter sequence keeps
    what it can up to half the budget, the longer gets the rest (the odd token goes to the second
    of two equal ones)."""
    if ids_b is None:
        return _cut(ids_a, budget, side), None
    if len(ids_a) + len(ids_b) <= budget:
        return ids_a, ids_b
    swap = len(ids_a) > len(ids_b)
    short, long = (len(ids_b), len(ids_a)) if swap else (len(ids_a), len(ids_b))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    keep_a, keep_b = (long, short) if swap else (short, long)
    return _cut(ids_a, keep_a, side), _cut(ids_b, keep_b, side)


def _cut(ids: list[int], length: int, side: str) -> list[int]:
    if length >= len(ids):
        return ids
    return ids[:length] if side == "right" else ids[len(ids) - length:]


def check_batch_options(padding, truncation, max_length, padding_side, truncation_side, return_tensors) -> None:
    """A clear error for each impossible option, before any text is encoded."""
    if padding not in PADDING_CHOICES:
        raise TokenizerError(f"padding={padding!r} is not one of {', '.join(map(repr, PADDING_CHOICES))}")
    if not isinstance(truncation, bool):
        raise TokenizerError(f"truncation={truncation!r} must be True or False")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
        raise TokenizerError(f"max_length={max_length!r} must be a positive integer")
    if (truncation or padding == "max_length") and max_length is None:
        raise TokenizerError("truncation=True and padding='max_length' need max_length")
    for name, side in (("padding_side", padding_side), ("truncation_side", truncation_side)):
        if side not in SIDES:
            raise TokenizerError(f"{name}={side!r} is not one of left, right")
    if return_tensors not in TENSOR_KINDS:
        raise TokenizerError(f"return_tensors={return_tensors!r} is not one of None, 'pt', 'np'")


def pad_rows(
    rows: dict[str, list[list[int]]], pad_values: dict[str, int], length: int, side: str
) -> dict[str, list[list[int]]]:
    """Every row of every key brought to ``length`` with that key's pad value, on ``side``."""
    padded: dict[str, list[list[int]]] = {}
    for key, key_rows in rows.items():
        value = pad_values[key]
        if side == "right":
            padded[key] = [row + [value] * (length - len(row)) for row in key_rows]
        else:
            padded[key] = [[value] * (length - len(row)) + row for row in key_rows]
    return padded


def as_tensors(rows: dict[str, list[list[int]]], kind: str) -> dict[str, Any]:
    """Lists of equal-length rows as int64 torch tensors (``"pt"``) or numpy arrays (``"np"``)."""
    lengths = {len(row) for key_rows in rows.values() for row in key_rows}
    if len(lengths) > 1:
        raise TokenizerError(
            f"return_tensors={kind!r} needs rows of one length, got lengths {min(lengths)}..{max(lengths)}; "
            "pass padding=True (or truncation with padding='max_length')"
        )
    if kind == "pt":
        import torch

        return {key: torch.tensor(key_rows, dtype=torch.long) for key, key_rows in rows.items()}
    import numpy as np

    return {key: np.array(key_rows, dtype=np.int64) for key, key_rows in rows.items()}
