"""``encode_batch``: many texts (or text pairs) as one :class:`~tformer.tokenizers.batch.BatchEncoding`,
truncated, padded and turned into tensors as a model's ``forward`` takes them. Plain id rows are made
directly (the common, lean path); offsets, overflowing windows, the special-tokens mask or word lists
go through ``encode_plus``'s :class:`~tformer.tokenizers.encoding.Encoding` objects."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tformer.tokenizers.batch import (
    BatchEncoding,
    as_tensors,
    check_batch_options,
    pad_rows,
    truncate_pair,
    truncation_strategy,
)
from tformer.tokenizers.encode_plus import check_text_list, check_word_lists
from tformer.tokenizers.encoding import Encoding
from tformer.tokenizers.errors import TokenizerError


class EncodeBatchMixin:
    """The batch part of ``Tokenizer``; it relies on the tokenizer's ``_encode_text(s)``, ``_combine``,
    template, pad token and (for rows with offsets or windows) ``EncodePlusMixin``."""

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str = False,
        max_length: int | None = None,
        stride: int = 0,
        padding_side: str = "right",
        truncation_side: str = "right",
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool = True,
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
        return_overflowing_tokens: bool = False,
        return_encodings: bool = False,
        is_split_into_words: bool = False,
    ) -> BatchEncoding:
        """Encode many texts (or text pairs) into a :class:`BatchEncoding` of ``input_ids``,
        ``attention_mask`` and, for models that use them, ``token_type_ids``.

        ``padding``: False, True/"longest" (to the longest row) or "max_length"; pads with the
        pad token on ``padding_side``. ``truncation`` (True = "longest_first", "only_first",
        "only_second") cuts each row so that with its special tokens it fits ``max_length``,
        dropping tokens on ``truncation_side``. ``return_tensors``: None (lists), "pt" (torch
        int64) or "np" (numpy int64).

        As in Hugging Face, ``return_offsets_mapping`` adds ``offset_mapping`` (each token's
        character span in its original text, (0, 0) for special tokens and padding),
        ``return_special_tokens_mask`` adds ``special_tokens_mask``, and
        ``return_overflowing_tokens`` makes one row per window of a truncated text, windows
        sharing ``stride`` tokens, with ``overflow_to_sample_mapping`` (row -> text index).
        Any of these, or ``return_encodings``, keeps each row's :class:`Encoding` in
        ``batch.encodings`` (``batch.word_ids(row)``, ``batch.sequence_ids(row)``).
        ``is_split_into_words``: each text (and pair) is a list of words (a CoNLL sentence);
        word ids then index those words and offsets are within each word, as in Hugging Face."""
        check_batch_options(padding, truncation, max_length, padding_side, truncation_side, return_tensors)
        _check_window_options(pad_to_multiple_of, stride)
        strategy = truncation_strategy(truncation)
        texts, pairs = _checked_texts(texts, pairs, is_split_into_words)
        with_types = ("token_type_ids" in self.model_input_names) if return_token_type_ids is None \
            else bool(return_token_type_ids)
        budget = None if strategy is None else self._truncation_budget(max_length, pairs is not None,
                                                                       add_special_tokens)
        if (return_encodings or return_offsets_mapping or return_special_tokens_mask or return_overflowing_tokens
                or is_split_into_words):
            return self._encode_batch_encodings(
                texts, pairs, add_special_tokens, strategy, budget, stride, truncation_side, return_overflowing_tokens,
                padding, max_length, padding_side, pad_to_multiple_of, with_types, return_attention_mask,
                return_offsets_mapping, return_special_tokens_mask, return_tensors, is_split_into_words)
        ids_rows, type_rows = self._encode_id_rows(texts, pairs, add_special_tokens, strategy, budget,
                                                   truncation_side, with_types)
        rows: dict[str, list[list[int]]] = {"input_ids": ids_rows}
        if with_types:
            rows["token_type_ids"] = type_rows
        if return_attention_mask:
            rows["attention_mask"] = [[1] * len(row) for row in ids_rows]
        if padding not in (False, "do_not_pad"):
            length = self._padded_length(padding, max_length, pad_to_multiple_of, map(len, ids_rows))
            rows = pad_rows(rows, {"input_ids": self._pad_id(), "token_type_ids": 0, "attention_mask": 0}, length,
                            padding_side)
        if return_tensors is not None:
            rows = as_tensors(rows, return_tensors)
        return BatchEncoding(rows)

    def _encode_id_rows(
        self, texts: list[str], pairs: list[str] | None, add_special_tokens: bool, strategy: str | None,
        budget: int | None, truncation_side: str, with_types: bool,
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Each text's (and pair's) ids, truncated and laid out by the template, with their type ids
        (left empty when ``with_types`` is false and no template or pair needs them)."""
        if pairs is None and budget is None and not (add_special_tokens and self.template.adds_tokens):
            ids_rows = self._encode_texts(texts)  # the common case, kept lean
            return ids_rows, ([[0] * len(row) for row in ids_rows] if with_types else [])
        encode_text = self._encode_text
        ids_rows, type_rows = [], []
        for index, text in enumerate(texts):
            ids_a = encode_text(text)
            ids_b = None if pairs is None else encode_text(pairs[index], "pair")
            if budget is not None:
                ids_a, ids_b = truncate_pair(ids_a, ids_b, budget, truncation_side, strategy)
            ids, type_ids = self._combine(ids_a, ids_b, add_special_tokens)
            ids_rows.append(ids)
            type_rows.append(type_ids)
        return ids_rows, type_rows

    @staticmethod
    def _padded_length(padding: bool | str, max_length: int | None, multiple_of: int | None,
                       lengths: Iterable[int]) -> int:
        length = max_length if padding == "max_length" else max(lengths, default=0)
        return -(-length // multiple_of) * multiple_of if multiple_of else length

    def _pad_id(self) -> int:
        pad_id = self.pad_token_id
        if pad_id is None:
            raise TokenizerError(
                "padding needs a pad token and this tokenizer has none; "
                "add one with add_special_tokens({'pad': ...}) (GPT-2 users often reuse the eos token)"
            )
        return pad_id

    def _encode_batch_encodings(
        self, texts, pairs, add_special_tokens, strategy, budget, stride, truncation_side, overflowing, padding,
        max_length, padding_side, pad_to_multiple_of, with_types, with_attention, with_offsets, with_special, tensors,
        split_into_words,
    ) -> BatchEncoding:
        """``encode_batch`` through :class:`Encoding` objects: one row per text, or per window."""
        encodings: list[Encoding] = []
        sample_of: list[int] = []
        for index, text in enumerate(texts):
            encoding = self._encode_plus(text, None if pairs is None else pairs[index], add_special_tokens, strategy,
                                         budget, stride, truncation_side, split_into_words)
            rows = [encoding, *encoding.overflowing] if overflowing else [encoding]
            encodings += rows
            sample_of += [index] * len(rows)
        if padding not in (False, "do_not_pad"):
            length = self._padded_length(padding, max_length, pad_to_multiple_of, map(len, encodings))
            pad_id = self._pad_id()
            pad_token = self.id_to_token(pad_id)
            encodings = [encoding.padded(length, pad_id, pad_token, padding_side) for encoding in encodings]
        rows: dict[str, list] = {"input_ids": [encoding.ids for encoding in encodings]}
        if with_types:
            rows["token_type_ids"] = [encoding.type_ids for encoding in encodings]
        if with_attention:
            rows["attention_mask"] = [encoding.attention_mask for encoding in encodings]
        if with_offsets:
            rows["offset_mapping"] = [encoding.offsets for encoding in encodings]
        if with_special:
            rows["special_tokens_mask"] = [encoding.special_tokens_mask for encoding in encodings]
        if overflowing:
            rows["overflow_to_sample_mapping"] = sample_of
        if tensors is not None:
            rows = as_tensors(rows, tensors)
        return BatchEncoding(rows, encodings)


def _check_window_options(pad_to_multiple_of: int | None, stride: int) -> None:
    """Refuse a padding multiple or a window stride that is not a usable integer."""
    if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
        raise TokenizerError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be a positive integer")
    if not isinstance(stride, int) or stride < 0:
        raise TokenizerError(f"stride={stride!r} must be an integer >= 0")


def _checked_texts(
    texts: Sequence, pairs: Sequence | None, split_into_words: bool
) -> tuple[list, list | None]:
    """The texts and pairs as lists (of str, or of word lists with ``is_split_into_words``), one pair
    per text."""
    check_list = check_word_lists if split_into_words else check_text_list
    texts = check_list(texts, "texts")
    if pairs is not None:
        pairs = check_list(pairs, "pairs")
        if len(pairs) != len(texts):
            raise TokenizerError(f"got {len(texts)} texts but {len(pairs)} pairs; they must match one to one")
    return texts, pairs
