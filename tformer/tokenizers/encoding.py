"""One encoded text (or text pair) with everything a span or tagging task needs beside the ids:
each token's character span in the original text, the word and the sequence it came from, which
tokens the template added, and the windows that did not fit (``overflowing``). The fields are
those of Hugging Face's ``tokenizers.Encoding``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tformer.tokenizers.batch import pad_rows

# (start, end) character span in the original text; special tokens have (0, 0).
Offset = tuple[int, int]


@dataclass
class Encoding:
    """``ids`` with, per token: ``type_ids`` (segment), ``tokens`` (vocabulary strings),
    ``offsets`` (span in the text it came from), ``word_ids`` (index of the pre-tokenized word in
    its sequence, None for special tokens and padding), ``sequence_ids`` (0 = text, 1 = pair,
    None = special or padding), ``special_tokens_mask`` (1 where the template or padding put a
    token) and ``attention_mask``. ``overflowing`` holds the further windows when truncation
    cut the text (each one a whole Encoding with its special tokens)."""

    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    offsets: list[Offset]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int]
    attention_mask: list[int]
    overflowing: list[Encoding] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def char_to_token(self, char_index: int, sequence_index: int = 0) -> int | None:
        """The token whose span holds character ``char_index`` of sequence ``sequence_index``,
        or None (a space, or a character outside this window)."""
        for index, (sequence, (start, end)) in enumerate(zip(self.sequence_ids, self.offsets, strict=True)):
            if sequence == sequence_index and start <= char_index < end:
                return index
        return None

    def token_span(self, start_char: int, end_char: int, sequence_index: int = 0) -> tuple[int, int] | None:
        """The first and last token (inclusive) covering characters ``[start_char, end_char)`` of
        sequence ``sequence_index``: the last token starting at or before ``start_char`` and the
        first ending at or after ``end_char``. None when this window does not hold the whole span
        (an extractive-QA window without the answer)."""
        if end_char <= start_char:
            raise ValueError(f"an empty or reversed character span [{start_char}, {end_char})")
        positions = [index for index, sequence in enumerate(self.sequence_ids) if sequence == sequence_index]
        if not positions or self.offsets[positions[0]][0] > start_char or self.offsets[positions[-1]][1] < end_char:
            return None
        first = next(index for index in reversed(positions) if self.offsets[index][0] <= start_char)
        last = next(index for index in positions if self.offsets[index][1] >= end_char)
        return first, max(first, last)

    def padded(self, length: int, pad_id: int, pad_token: str, side: str = "right") -> Encoding:
        """This encoding (and its overflowing windows) brought to ``length`` tokens with
        ``pad_id``: attention 0, special 1, offsets (0, 0), no word and no sequence."""
        names = ("ids", "type_ids", "tokens", "offsets", "word_ids", "sequence_ids", "special_tokens_mask",
                 "attention_mask")
        pad_values = dict(zip(names, (pad_id, 0, pad_token, (0, 0), None, None, 1, 0), strict=True))
        rows = pad_rows({name: [getattr(self, name)] for name in names}, pad_values, length, side)
        return replace(self, **{name: rows[name][0] for name in names},
                       overflowing=[window.padded(length, pad_id, pad_token, side) for window in self.overflowing])
