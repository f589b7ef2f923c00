"""Byte-level BPE, as in GPT-2: text is cut into words by a regex, each word's UTF-8 bytes
become byte characters, and merges are applied by rank (lowest first) until none applies.
Any text round-trips, since every byte has a token. Trainable, and readable from GPT-2's
``encoder.json`` + ``vocab.bpe``, ``vocab.json`` + ``merges.txt``, or a ``tokenizer.json``."""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, pairwise
from pathlib import Path
from typing import Any

from tformer.tokenizers.added_tokens import AddedToken, parse_special_tokens
from tformer.tokenizers.base import VocabularyTokenizer
from tformer.tokenizers.byte_level import BYTE_TO_CHAR, GPT2_PATTERN, PreTokenizer, to_byte_chars, token_bytes
from tformer.tokenizers.corpus import TextsOrFiles, count_words, training_progress
from tformer.tokenizers.encoding import Offset
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.merge_training import learn_merges
from tformer.tokenizers.normalizers import WHITE_SPACE, Alignment, Normalizer
from tformer.tokenizers.post_processor import Template

# Memoised words; the cache is emptied when it grows past this many entries.
CACHE_LIMIT = 200_000
# What offset trimming counts as a space in a token: the byte-level space "Ġ" and real whitespace.
_SPACE_CHARS = "".join(WHITE_SPACE) + BYTE_TO_CHAR[ord(" ")]


class MergeTokenizer(VocabularyTokenizer):
    """What both BPEs share (byte-level here, SentencePiece-style in ``sentencepiece_bpe``): a
    vocabulary, merges by rank, an optional unknown token and normalizer, a cache of words."""

    normalizer: Normalizer | None = None

    def _set_model(self, vocab: Mapping[str, int], merges: Sequence[tuple[str, str]], unk_token: str | None) -> None:
        self._set_vocabulary(_check_vocab(vocab))
        if unk_token is not None and unk_token not in self._vocab:
            raise TokenizerError(f"unk_token {unk_token!r} is not in the vocabulary")
        self._unk_token = unk_token
        self._unk_id = None if unk_token is None else self._vocab[unk_token]
        self._merge_pairs = [tuple(pair) for pair in merges]
        self._merges = merge_table(self._vocab, self._merge_pairs)
        self._cache: dict = {}

    @property
    def merges(self) -> list[tuple[str, str]]:
        return list(self._merge_pairs)

    def _normalize(self, text: str) -> str:
        return text if self.normalizer is None else self.normalizer(text)

    def _normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        return (text, None) if self.normalizer is None else self.normalizer.normalize_aligned(text)

    def _clear_cache(self) -> None:
        self._cache.clear()


class BPETokenizer(MergeTokenizer):
    """Byte-level BPE. ``vocab`` maps byte-level token strings ("Ġthe") to ids; ``merges``
    lists ``(left, right)`` pairs by rank. ``pattern`` is the pre-tokenization regex (GPT-2's
    by default). ``ignore_merges`` looks a whole word up in the vocabulary before merging
    (Llama-3 style); ``add_prefix_space`` puts a space before text that lacks one (RoBERTa).
    ``trim_offsets`` drops the spaces a token starts or ends with from its offsets, as
    RoBERTa's post-processor does (GPT-2's does not)."""

    kind = "bpe"

    def __init__(
        self,
        vocab: Mapping[str, int],
        merges: Sequence[tuple[str, str]],
        *,
        added_tokens: Mapping[int, AddedToken] | None = None,
        roles: Mapping[str, str] | None = None,
        template: Template | None = None,
        pattern: str = GPT2_PATTERN,
        unk_token: str | None = None,
        ignore_merges: bool = False,
        add_prefix_space: bool = False,
        normalizer: Normalizer | None = None,
        trim_offsets: bool = False,
    ) -> None:
        self._set_model(vocab, merges, unk_token)
        self._byte_ids = [self._vocab.get(char) for char in BYTE_TO_CHAR]
        self._missing_bytes = None in self._byte_ids
        self._split = PreTokenizer(pattern)
        self.pattern = pattern
        self.ignore_merges = ignore_merges
        self.add_prefix_space = add_prefix_space
        self.normalizer = normalizer
        self.trim_offsets = trim_offsets
        super().__init__(added_tokens, roles, template)

    # ---- the model ------------------------------------------------------------------------------

    def _refresh_added(self) -> None:
        super()._refresh_added()
        table = [b""] * self._vocab_size
        for token_id, token in self._id_to_token.items():
            table[token_id] = token_bytes(token)
        for token_id, text in self._added_text.items():
            table[token_id] = token_bytes(text)
        self._decode_table = table

    def _encode_normalized(self, text: str) -> list[int]:
        if self.add_prefix_space and text and not text.startswith(" "):
            text = " " + text
        return self._encode_words(self._split(text))

    def _encode_normalized_with_offsets(self, text: str) -> tuple[list[int], list[Offset], list[int], int]:
        """Offsets in characters: a token holding part of a character's bytes (an emoji split in
        two) spans that whole character, as in Hugging Face."""
        if self._missing_bytes:
            raise TokenizerError("offsets need every byte in the vocabulary; this BPE lacks some")
        prefixed = self.add_prefix_space and text and not text.startswith(" ")
        if prefixed:  # the added space stands on the first character
            text = " " + text
        words = self._split(text)
        ids = self._encode_words(words)
        offsets: list[Offset] = []
        word_ids: list[int] = []
        table, cache = self._decode_table, self._cache
        start = 0
        for word_index, word in enumerate(words):
            word_token_ids = cache.get(word)
            if word_token_ids is None:
                word_token_ids = self._encode_word(word)
            word_ids += [word_index] * len(word_token_ids)
            if word.isascii():
                char_at = None
            else:  # byte position in the word -> character position
                char_at = [index for index, char in enumerate(word) for _ in char.encode("utf-8")]
            position = 0
            for token_id in word_token_ids:
                end = position + len(table[token_id])
                if char_at is None:
                    offsets.append((start + position, start + end))
                else:
                    offsets.append((start + char_at[position], start + char_at[end - 1] + 1))
                position = end
            start += len(word)
        if prefixed:
            offsets = [(max(begin - 1, 0), max(end - 2, 0) + 1) for begin, end in offsets]
        return ids, offsets, word_ids, len(words)

    def _encode_words_with_offsets(self, words: list[str], what: str = "text") -> tuple[list, list, list]:
        if not self.add_prefix_space:
            raise TokenizerError("is_split_into_words with byte-level BPE needs add_prefix_space=True (as RoBERTa's "
                                 "tokenizer for tagging is made), else every word is encoded as if it began the text")
        return super()._encode_words_with_offsets(words, what)

    def _trim_offsets(self, ids: list[int], offsets: list[Offset]) -> list[Offset]:
        """Hugging Face's ByteLevel trimming: a token's leading and trailing spaces leave its span,
        except the one space ``add_prefix_space`` put before a sequence's first token."""
        if not self.trim_offsets:
            return offsets
        trimmed = []
        tokens = self._token_strings()
        for index, (token_id, (start, end)) in enumerate(zip(ids, offsets, strict=True)):
            token = tokens[token_id]
            leading = len(token) - len(token.lstrip(_SPACE_CHARS))
            trailing = len(token) - len(token.rstrip(_SPACE_CHARS))
            if leading and self.add_prefix_space and leading == 1 and (index == 0 or start == 0):
                leading = 0
            if leading:
                start = min(start + leading, end)
            if trailing and end >= trailing:
                end = max(end - trailing, start)
            trimmed.append((start, end))
        return trimmed

    def _encode_words(self, words: list[str]) -> list[int]:
        """The ids of pre-tokenized words, each merged once and then remembered."""
        cache = self._cache
        try:  # every word seen before: one C-level pass
            return list(chain.from_iterable(map(cache.__getitem__, words)))
        except KeyError:
            pass
        if len(cache) > CACHE_LIMIT:
            cache.clear()
        encode_word = self._encode_word
        for word in words:
            if word not in cache:
                cache[word] = encode_word(word)
        return list(chain.from_iterable(map(cache.__getitem__, words)))

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        """``encode_batch``'s loop with the usual case (no normalizer, no prefix space, no added
        token in the text) inlined: the ids of ``_encode_text``, with less overhead per text."""
        if self.normalizer is not None or self.add_prefix_space:
            return super()._encode_texts(texts)
        split, splitter, lookup = self._split, self._splitter, self._cache.__getitem__
        rows = []
        for text in texts:
            if splitter is not None and splitter.could_match(text):
                rows.append(self._encode_text(text))
                continue
            words = split(text)
            try:
                rows.append(list(chain.from_iterable(map(lookup, words))))
            except KeyError:
                rows.append(self._encode_words(words))
        return rows

    def _encode_word(self, word: str) -> list[int]:
        """The ids of one pre-tokenized word: its bytes, merged as in GPT-2 (:func:`apply_merges`)."""
        if self.ignore_merges:
            whole = self._vocab.get(to_byte_chars(word))
            if whole is not None:
                return [whole]
        if self._missing_bytes:
            ids = self._replace_missing([self._byte_ids[byte] for byte in word.encode("utf-8")])
        else:
            ids = list(map(self._byte_ids.__getitem__, word.encode("utf-8")))
        return [symbol for symbol in apply_merges(ids, self._merges.get) if symbol is not None]

    def _replace_missing(self, ids: list[int | None]) -> list[int]:
        """Bytes the vocabulary lacks become the unknown token, or vanish without one (as in
        Hugging Face's BPE)."""
        if self._unk_id is None:
            return [token_id for token_id in ids if token_id is not None]
        return [self._unk_id if token_id is None else token_id for token_id in ids]

    def _decode_ids(self, ids: list[int]) -> str:
        table = self._decode_table
        return b"".join([table[token_id] for token_id in ids]).decode("utf-8", errors="replace")

    # ---- tokenizer.json -------------------------------------------------------------------------

    def _post_processor_json(self) -> dict:
        """The template, after ByteLevel's offset trimming when it is on (RoBERTa's processing
        holds the trimming itself)."""
        if self.template.roberta:
            return self.template.to_json(self._template_token_id, self.trim_offsets, self.add_prefix_space)
        template = super()._post_processor_json()
        if not self.trim_offsets:
            return template
        trimming = {"type": "ByteLevel", "add_prefix_space": self.add_prefix_space, "trim_offsets": True,
                    "use_regex": True}
        if self.template == Template():
            return trimming
        return {"type": "Sequence", "processors": [trimming, template]}

    def _json_parts(self) -> dict[str, Any]:
        byte_level = {"type": "ByteLevel", "add_prefix_space": self.add_prefix_space, "trim_offsets": True}
        if self.pattern == GPT2_PATTERN:
            pre_tokenizer = {**byte_level, "use_regex": True}
        else:
            pre_tokenizer = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": self.pattern}, "behavior": "Isolated", "invert": False},
                {**byte_level, "use_regex": False},
            ]}
        return {
            "normalizer": None if self.normalizer is None else self.normalizer.to_json(),
            "pre_tokenizer": pre_tokenizer,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": self._unk_token,
                "continuing_subword_prefix": "",
                "end_of_word_suffix": "",
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": self.ignore_merges,
                "vocab": dict(sorted(self._vocab.items(), key=lambda item: item[1])),
                "merges": [list(pair) for pair in self._merge_pairs],
            },
        }

    # ---- other files ----------------------------------------------------------------------------

    @classmethod
    def from_gpt2_files(cls, vocab_file: str | os.PathLike, merges_file: str | os.PathLike) -> BPETokenizer:
        """GPT-2's own files: ``encoder.json`` (or ``vocab.json``) and ``vocab.bpe`` (or
        ``merges.txt``). "<|endoftext|>" becomes a special token (bos and eos), as in GPT-2."""
        vocab = _read_json_vocab(Path(vocab_file))
        merges = read_merges(Path(merges_file))
        specials = {token_id: AddedToken(token) for token, token_id in vocab.items() if token == "<|endoftext|>"}
        roles = {"bos": "<|endoftext|>", "eos": "<|endoftext|>"} if specials else {}
        return cls(vocab, merges, added_tokens=specials, roles=roles)

    # ---- training -------------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts_or_files: TextsOrFiles,
        vocab_size: int,
        min_frequency: int = 2,
        special_tokens: Iterable[str] | dict[str, str] = ("<|endoftext|>",),
        pattern: str = GPT2_PATTERN,
        progress: bool = False,
    ) -> BPETokenizer:
        """Learn a byte-level BPE of ``vocab_size`` tokens: the special tokens (ids 0..), the
        256 bytes, then one token per merge of the most frequent pair (with at least
        ``min_frequency`` occurrences). ``texts_or_files``: str texts and/or Path files."""
        specials, roles = parse_special_tokens(special_tokens)
        minimum = len(specials) + 256
        if not isinstance(vocab_size, int) or vocab_size < minimum:
            raise TokenizerError(f"vocab_size={vocab_size} is too small: a byte-level BPE needs the 256 byte tokens "
                                 f"plus {len(specials)} special tokens, at least {minimum}")
        word_counts = count_words(texts_or_files, PreTokenizer(pattern), specials)
        vocab = [*specials, *sorted(BYTE_TO_CHAR)]  # bytes in code point order, as Hugging Face does
        first_byte = len(specials)
        byte_id = {BYTE_TO_CHAR.index(char): first_byte + offset for offset, char in enumerate(sorted(BYTE_TO_CHAR))}
        byte_ids = [byte_id[byte] for byte in range(256)]
        words = [[byte_ids[byte] for byte in word.encode("utf-8")] for word in word_counts]
        counts = list(word_counts.values())
        bar = training_progress(progress, vocab_size - len(vocab), "merges")
        merges = learn_merges(words, counts, vocab, vocab_size, min_frequency, str.__add__,
                              on_merge=None if bar is None else bar.update)
        if bar is not None:
            bar.close()
        return cls(
            {token: token_id for token_id, token in enumerate(vocab)},
            [(vocab[left], vocab[right]) for left, right in merges],
            added_tokens={token_id: AddedToken(token) for token_id, token in enumerate(specials)},
            roles=roles,
            pattern=pattern,
        )


# (left id, right id) -> (rank, id of the merged token).
MergeTable = dict[tuple[int, int], tuple[int, int]]


def merge_table(vocab: Mapping[str, int], merges: Sequence[tuple[str, str]]) -> MergeTable:
    """The merges by rank as ids; a merge whose parts or result the vocabulary lacks is refused.
    A pair listed twice keeps its last rank, as in Hugging Face."""
    table: MergeTable = {}
    for rank, pair in enumerate(merges):
        if len(pair) != 2:
            raise TokenizerError(f"merge {rank} is {pair!r}; a merge is a pair of tokens")
        left, right = pair
        ids = (vocab.get(left), vocab.get(right), vocab.get(left + right))
        if None in ids:
            missing = next(token for token, token_id in zip((left, right, left + right), ids, strict=True)
                           if token_id is None)
            raise TokenizerError(f"merge {rank} ({left!r} {right!r}): {missing!r} is not in the vocabulary")
        table[ids[0], ids[1]] = (rank, ids[2])
    return table


def apply_merges(ids: list[int], get: Callable[[tuple[int, int]], tuple[int, int] | None]) -> list[int | None]:
    """``ids`` merged lowest rank first (leftmost first among equals), as GPT-2 and Hugging Face
    do; ``get`` is a :data:`MergeTable`'s ``get``. A merged token stands at its first symbol's
    position and the positions it absorbed hold None (so callers can tell which symbols each
    token covers). A heap of (rank, position, result) over a linked list of symbols makes that
    O(n log n) even for a word of a million spaces; entries whose pair has changed since they
    were pushed are skipped when popped."""
    count = len(ids)
    if count < 2:
        return ids
    heap = [(merge[0], position, merge[1])
            for position, merge in enumerate(map(get, pairwise(ids))) if merge is not None]
    if not heap:
        return ids
    heapq.heapify(heap)
    after = list(range(1, count + 1))  # linked list: after[i] / before[i] is the next / previous symbol
    after[-1] = -1
    before = list(range(-1, count - 1))
    symbols: list[int | None] = ids
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        rank, position, new_id = pop(heap)
        right = after[position]
        if right == -1 or symbols[position] is None:
            continue
        merge = get((symbols[position], symbols[right]))
        if merge is None or merge[0] != rank:
            continue
        symbols[position] = new_id
        symbols[right] = None
        following = after[position] = after[right]
        if following != -1:
            before[following] = position
            merge = get((new_id, symbols[following]))
            if merge is not None:
                push(heap, (merge[0], position, merge[1]))
        left = before[position]
        if left != -1:
            merge = get((symbols[left], new_id))
            if merge is not None:
                push(heap, (merge[0], left, merge[1]))
    return symbols


def read_merges(path: Path) -> list[tuple[str, str]]:
    """Merges from ``vocab.bpe`` / ``merges.txt``: an optional "#version" line, then one
    "left right" pair per line."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as error:
        raise TokenizerError(f"{path}: cannot read the merges file ({error})") from None
    merges = []
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerError(f"{path}:{number}: a merge line is two tokens separated by one space, got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def _read_json_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenizerError(f"{path}: cannot read the vocabulary ({error})") from None
    if not isinstance(vocab, dict):
        raise TokenizerError(f"{path}: a vocabulary file is a json object of token: id")
    return vocab


def _check_vocab(vocab: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(vocab, Mapping):
        raise TokenizerError(f"vocab must map tokens to ids, got {type(vocab).__name__}")
    seen: dict[int, str] = {}
    for token, token_id in vocab.items():
        if not isinstance(token, str) or type(token_id) is not int or token_id < 0:
            raise TokenizerError(f"vocab entry {token!r}: {token_id!r} must be a str mapped to an id >= 0")
        if token_id in seen:
            raise TokenizerError(f"vocab ids must be unique: {seen[token_id]!r} and {token!r} both have id {token_id}")
        seen[token_id] = token
    return dict(vocab)
