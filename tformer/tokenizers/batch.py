"""What ``encode_batch`` returns, and the truncation and padding that make a batch rectangular.
Keys follow the ecosystem: ``input_ids``, ``attention_mask`` (1 = attend), ``token_type_ids``,
so ``model(**batch)`` works."""

from __future__ import annotations

from typing import Any

from tformer.tokenizers.errors import TokenizerError

PADDING_CHOICES = (False, True, "longest", "max_length", "do_not_pad")
SIDES = ("left", "right")
TENSOR_KINDS = (None, "pt", "np")
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


class BatchEncoding(dict):
    """A dict of equal-length lists (or tensors) with attribute access: ``batch.input_ids``.
    Encoded with ``return_encodings`` (or offsets, overflowing windows, the special-tokens
    mask), it also keeps each row's :class:`~tformer.tokenizers.encoding.Encoding` in
    ``encodings``, read through ``word_ids(row)``, ``sequence_ids(row)`` and ``tokens(row)``."""

    def __init__(self, data: dict | None = None, encodings: list | None = None) -> None:
        super().__init__(data or {})
        self.encodings = encodings

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"this batch has no {name!r}; it has {', '.join(self)}") from None

    def to(self, device) -> BatchEncoding:
        """The same batch with its tensors moved to ``device``."""
        return BatchEncoding({key: value.to(device) if hasattr(value, "to") else value for key, value in self.items()},
                             self.encodings)

    def word_ids(self, row: int = 0) -> list[int | None]:
        """The word each token of ``row`` came from (None for special tokens and padding)."""
        return self._encoding(row).word_ids

    def sequence_ids(self, row: int = 0) -> list[int | None]:
        """0 for tokens of the text, 1 for the pair, None for special tokens and padding."""
        return self._encoding(row).sequence_ids

    def tokens(self, row: int = 0) -> list[str]:
        return self._encoding(row).tokens

    def _encoding(self, row: int):
        if self.encodings is None:
            raise TokenizerError("this batch keeps no encodings; encode it with return_encodings=True")
        return self.encodings[row]


def truncate_pair(
    ids_a: list[int], ids_b: list[int] | None, budget: int, side: str, strategy: str = "longest_first"
) -> tuple[list[int], list[int] | None]:
    """Cut ``ids_a`` (+ ``ids_b``) to ``budget`` tokens in all by ``strategy`` (see
    :func:`truncation_lengths`), from the end (``side="right"``) or the start."""
    keep_a, keep_b = truncation_lengths(len(ids_a), None if ids_b is None else len(ids_b), budget, strategy)
    return _cut(ids_a, keep_a, side), None if ids_b is None else _cut(ids_b, keep_b, side)


def truncation_lengths(length_a: int, length_b: int | None, budget: int, strategy: str) -> tuple[int, int]:
    """How many tokens of the text and of its pair (0 without one) to keep so that together they
    fit ``budget``, as Hugging Face decides. ``longest_first``: the shorter sequence keeps what it
    can up to half the budget, the longer gets the rest (the odd token goes to the second of two
    equal ones); ``only_first`` / ``only_second``: only that sequence is cut, and it must keep at
    least one token."""
    if strategy not in TRUNCATION_STRATEGIES:
        raise TokenizerError(f"truncation={strategy!r} is not one of {', '.join(map(repr, TRUNCATION_STRATEGIES))}")
    if strategy == "only_second" and length_b is None:
        raise TokenizerError("truncation='only_second' needs text pairs; this text has none")
    total = length_a + (length_b or 0)
    if total <= budget:
        return length_a, length_b or 0
    if strategy == "longest_first":
        if length_b is None:
            return budget, 0
        swap = length_a > length_b
        short, long = (length_b, length_a) if swap else (length_a, length_b)
        long = short if short > budget else max(short, budget - short)
        if short + long > budget:
            short, long = budget // 2, budget // 2 + budget % 2
        return (long, short) if swap else (short, long)
    target = length_a if strategy == "only_first" else length_b
    excess = total - budget
    if target <= excess:
        which = "first text" if strategy == "only_first" else "pair"
        raise TokenizerError(f"truncation={strategy!r} cannot fit max_length: the {which} has {target} tokens and "
                             f"{excess} must go (the other sequence and the special tokens take the rest)")
    return (target - excess, length_b or 0) if strategy == "only_first" else (length_a, target - excess)


def windows(length: int, keep: int, stride: int, side: str) -> list[tuple[int, int]]:
    """The (start, stop) token ranges a sequence of ``length`` tokens is cut into when ``keep``
    fit: the first is what truncation keeps, the others (Hugging Face's overflowing tokens) step
    by ``keep - stride``, so neighbours share ``stride`` tokens, until the sequence is covered.
    ``side="left"`` keeps the end and steps towards the start."""
    if keep >= length:
        return [(0, length)]
    if keep == 0:
        return [(0, 0), (0, length)]
    if not 0 <= stride < keep:
        raise TokenizerError(f"stride={stride} must be smaller than the {keep} tokens the truncated sequence keeps "
                             "(max_length less the special tokens and the other sequence)")
    step = keep - stride
    ranges = []
    if side == "right":
        for start in range(0, length, step):
            ranges.append((start, min(start + keep, length)))
            if start + keep >= length:
                break
    else:
        for last in range(length - 1, -1, -step):
            ranges.append((max(last + 1 - keep, 0), last + 1))
            if last + 1 - keep <= 0:
                break
    return ranges


def _cut(ids: list[int], length: int, side: str) -> list[int]:
    if length >= len(ids):
        return ids
    return ids[:length] if side == "right" else ids[len(ids) - length:]


def truncation_strategy(truncation: bool | str) -> str | None:
    """``encode_batch``'s ``truncation`` as a strategy name, or None for no truncation."""
    if truncation is True:
        return "longest_first"
    if truncation is False or truncation == "do_not_truncate":
        return None
    if truncation not in TRUNCATION_STRATEGIES:
        raise TokenizerError(f"truncation={truncation!r} is not one of True, False, 'do_not_truncate', "
                             f"{', '.join(map(repr, TRUNCATION_STRATEGIES))}")
    return truncation


def check_batch_options(padding, truncation, max_length, padding_side, truncation_side, return_tensors) -> None:
    """A clear error for each impossible option, before any text is encoded."""
    if padding not in PADDING_CHOICES:
        raise TokenizerError(f"padding={padding!r} is not one of {', '.join(map(repr, PADDING_CHOICES))}")
    strategy = truncation_strategy(truncation)
    if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
        raise TokenizerError(f"max_length={max_length!r} must be a positive integer")
    if (strategy or padding == "max_length") and max_length is None:
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


def as_tensors(rows: dict[str, list], kind: str) -> dict[str, Any]:
    """Lists of equal-length rows as int64 torch tensors (``"pt"``) or numpy arrays (``"np"``);
    ``offset_mapping`` becomes (B, T, 2), ``overflow_to_sample_mapping`` (B,)."""
    lengths = {len(row) for key, key_rows in rows.items() if key != "overflow_to_sample_mapping" for row in key_rows}
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
