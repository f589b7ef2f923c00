"""``encode_plus``: a text (and its pair) as an :class:`~tformer.tokenizers.encoding.Encoding`, the
ids together with each token's character span in the original string, its word and sequence, the
template's special tokens marked, and the windows that truncation cut off (``overflowing``), in
Hugging Face's order. ``encode_batch`` goes through here whenever a caller asks for any of these."""

from __future__ import annotations

from collections.abc import Sequence

from tformer.tokenizers.batch import check_batch_options, truncation_lengths, truncation_strategy, windows
from tformer.tokenizers.encoding import Encoding, Offset
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.post_processor import SEQUENCE_A, SEQUENCE_B

# One sequence encoded with offsets: its ids, each token's (start, end) and each token's word index.
AlignedIds = tuple[list[int], list[Offset], list[int]]
Window = tuple[int, int]  # [start, stop) of the tokens of one sequence that one Encoding holds


class EncodePlusMixin:
    """The aligned-encoding part of ``Tokenizer``; it relies on the tokenizer's template, added-token
    splitter, ``_normalize_aligned``, ``_encode_piece_with_offsets`` and ``_trim_offsets``."""

    def encode_plus(
        self,
        text: str | Sequence[str],
        pair: str | Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        truncation: bool | str = False,
        max_length: int | None = None,
        stride: int = 0,
        truncation_side: str = "right",
        is_split_into_words: bool = False,
    ) -> Encoding:
        """``text`` (and ``pair``) as an :class:`Encoding`: ids, type ids, tokens, offsets into the
        original strings, word ids, sequence ids, masks. With ``truncation`` (True =
        "longest_first", "only_first", "only_second") and ``max_length``, the tokens that do not fit
        come back as ``overflowing`` windows sharing ``stride`` tokens with their neighbour.
        ``is_split_into_words``: ``text`` (and ``pair``) are lists of words, each encoded on its
        own; word ids index them and offsets are within each word."""
        check_batch_options(False, truncation, max_length, "right", truncation_side, None)
        if not isinstance(stride, int) or stride < 0:
            raise TokenizerError(f"stride={stride!r} must be an integer >= 0")
        if is_split_into_words:
            text = check_word_lists([text], "text")[0]
            pair = None if pair is None else check_word_lists([pair], "pair")[0]
        strategy = truncation_strategy(truncation)
        budget = None if strategy is None else self._truncation_budget(max_length, pair is not None,
                                                                       add_special_tokens)
        return self._encode_plus(text, pair, add_special_tokens, strategy, budget, stride, truncation_side,
                                 is_split_into_words)

    def _truncation_budget(self, max_length: int, pair: bool, add_special_tokens: bool) -> int:
        """How many text tokens fit ``max_length`` beside the template's special tokens."""
        specials = self.template.num_special_tokens(pair) if add_special_tokens else 0
        budget = max_length - specials
        if budget < 1:
            raise TokenizerError(f"max_length={max_length} leaves no room for text: "
                                 f"the template adds {specials} special tokens")
        return budget

    def _encode_plus(self, text, pair, add_special_tokens, strategy, budget, stride, side, split_into_words=False
                     ) -> Encoding:
        encode = self._encode_words_with_offsets if split_into_words else self._encode_text_with_offsets
        part_a = encode(text)
        part_b = None if pair is None else encode(pair, "pair")
        length_a, length_b = len(part_a[0]), None if part_b is None else len(part_b[0])
        if strategy is None:
            windows_a, windows_b = [(0, length_a)], [(0, length_b or 0)]
        else:
            keep_a, keep_b = truncation_lengths(length_a, length_b, budget, strategy)
            windows_a, windows_b = windows(length_a, keep_a, stride, side), windows(length_b or 0, keep_b, stride, side)
        # Hugging Face's order: the first windows together, then each later window of the text with
        # the pair's windows, then the text's first window with the pair's later windows.
        combined = [(windows_a[0], windows_b[0])]
        for window_a in windows_a[1:]:
            combined += [(window_a, window_b) for window_b in windows_b]
        combined += [(windows_a[0], window_b) for window_b in windows_b[1:]]
        encodings = [self._assemble(part_a, window_a, part_b, window_b, add_special_tokens)
                     for window_a, window_b in combined]
        encodings[0].overflowing = encodings[1:]
        return encodings[0]

    def _assemble(self, part_a: AlignedIds, window_a: Window, part_b: AlignedIds | None, window_b: Window,
                  add_special_tokens: bool) -> Encoding:
        """One window of the text (and of the pair) laid out by the template."""
        if add_special_tokens:
            layout = self.template.single if part_b is None else self.template.pair
        else:
            layout = ((SEQUENCE_A, 0),) if part_b is None else (
                (SEQUENCE_A, 0), (SEQUENCE_B, self.template.plain_pair_type_id))
        ids, type_ids, offsets, word_ids, sequence_ids, special = [], [], [], [], [], []
        for item, type_id in layout:
            if item in (SEQUENCE_A, SEQUENCE_B):
                sequence = int(item == SEQUENCE_B)
                part_ids, part_offsets, part_words = part_b if sequence else part_a
                start, stop = window_b if sequence else window_a
                window_ids = part_ids[start:stop]
                ids += window_ids
                offsets += self._trim_offsets(window_ids, part_offsets[start:stop])
                word_ids += part_words[start:stop]
                count = stop - start
                sequence_ids += [sequence] * count
                special += [0] * count
            else:
                ids.append(self._template_token_id(item))
                offsets.append((0, 0))
                word_ids.append(None)
                sequence_ids.append(None)
                special.append(1)
                count = 1
            type_ids += [type_id] * count
        return Encoding(ids, type_ids, list(map(self._token_strings().__getitem__, ids)), offsets, word_ids,
                        sequence_ids, special, [1] * len(ids))

    def _token_strings(self) -> list[str | None]:
        """``id_to_token`` of every id, as one list (built once, after the vocabulary last changed)."""
        if self._tokens_by_id is None:
            self._tokens_by_id = [self.id_to_token(token_id) for token_id in range(self._vocab_size)]
        return self._tokens_by_id

    def _encode_text_with_offsets(self, text: str, what: str = "text") -> AlignedIds:
        """``_encode_text`` with each token's (start, end) in ``text`` and its word index (each
        added token found in the text is a word of its own, as in Hugging Face)."""
        if not isinstance(text, str):
            raise TokenizerError(f"{what} must be a str, got {type(text).__name__}")
        splitter = self._splitter
        raw_pieces = [(text, None)] if splitter is None or not splitter.could_match(text) else splitter.split_raw(text)
        ids: list[int] = []
        offsets: list[Offset] = []
        word_ids: list[int] = []
        word_count = 0
        raw_start = 0
        for raw_piece, token_id in raw_pieces:
            raw_end = raw_start + len(raw_piece)
            if token_id is not None:
                ids.append(token_id)
                offsets.append((raw_start, raw_end))
                word_ids.append(word_count)
                word_count += 1
                raw_start = raw_end
                continue
            normalized, source = self._normalize_aligned(raw_piece)
            pieces = [(normalized, None)] if splitter is None else splitter.split_normalized(normalized)
            start = 0
            for piece, piece_token_id in pieces:
                if piece_token_id is not None:
                    piece_ids, piece_offsets, piece_words, count = [piece_token_id], [(0, len(piece))], [0], 1
                else:
                    piece_ids, piece_offsets, piece_words, count = self._encode_piece_with_offsets(
                        piece, raw_start == 0 and start == 0)
                ids += piece_ids
                word_ids += [word + word_count for word in piece_words]
                word_count += count
                if source is None:
                    offsets += [(raw_start + start + begin, raw_start + start + end) for begin, end in piece_offsets]
                else:  # a token spans from its first character's source to its last one's (none is empty)
                    offsets += [(raw_start + source[start + begin], raw_start + source[start + end - 1] + 1)
                                for begin, end in piece_offsets]
                start += len(piece)
            raw_start = raw_end
        return ids, offsets, word_ids

    def _encode_words_with_offsets(self, words: list[str], what: str = "text") -> AlignedIds:
        """Pre-split words, each encoded on its own: word ids are the words' indices, offsets are
        within each word (Hugging Face's ``is_split_into_words``)."""
        ids: list[int] = []
        offsets: list[Offset] = []
        word_ids: list[int] = []
        for index, word in enumerate(words):
            word_token_ids, word_offsets, _ = self._encode_text_with_offsets(word, what)
            ids += word_token_ids
            offsets += word_offsets
            word_ids += [index] * len(word_token_ids)
        return ids, offsets, word_ids


def check_word_lists(texts: Sequence[Sequence[str]], what: str) -> list[list[str]]:
    """Texts given as lists of words (``is_split_into_words``)."""
    if isinstance(texts, str):
        raise TokenizerError(f"{what} must be lists of words with is_split_into_words=True, got one str")
    rows = []
    for index, words in enumerate(texts):
        if isinstance(words, str) or not isinstance(words, Sequence):
            raise TokenizerError(f"{what}[{index}] must be a list of words with is_split_into_words=True, "
                                 f"got {type(words).__name__}")
        rows.append(check_text_list(words, f"{what}[{index}]"))
    return rows


def check_text_list(texts: Sequence[str], what: str) -> list[str]:
    """A list of str (not one str), as a list."""
    if isinstance(texts, str):
        raise TokenizerError(f"{what} must be a list of str, got one str; use encode for a single text")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TokenizerError(f"{what}[{index}] must be a str, got {type(text).__name__}")
    return texts
