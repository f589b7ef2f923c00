"""SentencePiece-style BPE (Llama 2, Mistral, Gemma) as Hugging Face's ``tokenizers`` runs it:
BPE over characters, not bytes. A space is "▁" (put there by the normalizer, legacy Llama 2's
Prepend + Replace and Gemma's Replace, or by a Metaspace pre-tokenizer); a character the
vocabulary lacks becomes its UTF-8 bytes as "<0xE6>" tokens (``byte_fallback``), else the
unknown token (a run of them fused into one with ``fuse_unk``); merges apply by rank; decoding
is Hugging Face's decoder chain (Replace, ByteFallback, Fuse, Strip, Metaspace). Read and
written as tokenizer.json; not trainable here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any

from tformer.tokenizers.added_tokens import AddedToken
from tformer.tokenizers.bpe import CACHE_LIMIT, MergeTokenizer, apply_merges
from tformer.tokenizers.decoders import ByteFallbackDecoder, DecoderChain, FuseDecoder, ReplaceDecoder
from tformer.tokenizers.encoding import Offset
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.normalizers import Normalizer
from tformer.tokenizers.post_processor import Template
from tformer.tokenizers.pre_tokenizers import SplitPreTokenizer
from tformer.tokenizers.unigram import Metaspace

# Words longer than this are merged afresh each time rather than remembered (a legacy Llama 2
# file has no pre-tokenizer, so its "word" is a whole text).
_CACHED_WORD_LENGTH = 256


def byte_token(byte: int) -> str:
    """The vocabulary string of a byte-fallback token: "<0x0A>" for a newline."""
    return f"<0x{byte:02X}>"


class SentencePieceBPETokenizer(MergeTokenizer):
    """BPE over characters. ``vocab`` maps pieces ("▁the", "<0x0A>") to ids, ``merges`` lists
    ``(left, right)`` by rank. ``pre_tokenizer``: None (the normalized text is one word), a
    :class:`Metaspace` or a :class:`SplitPreTokenizer`. ``ignore_merges`` takes a word found
    whole in the vocabulary as one token before merging."""

    kind = "sentencepiece_bpe"

    def __init__(
        self,
        vocab: Mapping[str, int],
        merges: Sequence[tuple[str, str]],
        *,
        unk_token: str | None = None,
        byte_fallback: bool = False,
        fuse_unk: bool = False,
        ignore_merges: bool = False,
        normalizer: Normalizer | None = None,
        pre_tokenizer: Metaspace | SplitPreTokenizer | None = None,
        decoder: DecoderChain | None = None,
        added_tokens: Mapping[int, AddedToken] | None = None,
        roles: Mapping[str, str] | None = None,
        template: Template | None = None,
    ) -> None:
        self._set_model(vocab, merges, unk_token)
        if pre_tokenizer is not None and not isinstance(pre_tokenizer, (Metaspace, SplitPreTokenizer)):
            raise TokenizerError(f"pre_tokenizer must be None, a Metaspace or a Split, got "
                                 f"{type(pre_tokenizer).__name__}")
        self._byte_ids = [self._vocab.get(byte_token(byte)) for byte in range(256)]
        self.byte_fallback = bool(byte_fallback)
        self.fuse_unk = bool(fuse_unk)
        self.ignore_merges = bool(ignore_merges)
        self.normalizer = normalizer
        self.pre_tokenizer = pre_tokenizer
        self.decoder = decoder if decoder is not None else DecoderChain(
            [ReplaceDecoder("▁", " "), ByteFallbackDecoder(), FuseDecoder()])
        super().__init__(added_tokens, roles, template)

    # ---- the model ------------------------------------------------------------------------------

    def _refresh_added(self) -> None:
        super()._refresh_added()
        table = [""] * self._vocab_size
        for token_id, token in self._id_to_token.items():
            table[token_id] = token
        for token_id, token in self._added.items():  # Hugging Face decodes an added token's own text
            table[token_id] = token.content
        self._decode_table = table

    def _words(self, text: str, first: bool, sources: bool) -> list[tuple[str, list[int] | None]]:
        """The pre-tokenized words of ``text`` and, with ``sources``, each word character's index in ``text``."""
        pre_tokenizer = self.pre_tokenizer
        if isinstance(pre_tokenizer, Metaspace):
            return pre_tokenizer.cut(text, first, sources)
        spans = [(0, len(text))] if pre_tokenizer is None else pre_tokenizer.spans(text)
        return [(text[start:end], list(range(start, end)) if sources else None) for start, end in spans if end > start]

    def _encode_normalized(self, text: str) -> list[int]:
        return self._encode_piece(text, True)

    def _encode_piece(self, text: str, first: bool) -> list[int]:
        ids: list[int] = []
        for word, _ in self._words(text, first, sources=False):
            ids += [symbol for symbol in self._merged(word)[0] if symbol is not None]
        return ids

    def _encode_normalized_with_offsets(self, text: str) -> tuple[list[int], list[Offset], list[int], int]:
        return self._encode_piece_with_offsets(text, True)

    def _encode_piece_with_offsets(self, text: str, first: bool) -> tuple[list[int], list[Offset], list[int], int]:
        """Offsets as Hugging Face counts them: each symbol covers the next bytes of its word (a
        byte token one, an unknown run its bytes), and a token holding part of a character's
        bytes spans that whole character."""
        ids: list[int] = []
        offsets: list[Offset] = []
        word_ids: list[int] = []
        words = self._words(text, first, sources=True)
        for word_index, (word, source) in enumerate(words):
            symbols, lengths = self._merged(word)
            char_at = [index for index, char in enumerate(word) for _ in char.encode("utf-8")]
            bounds = [0, *accumulate(lengths)]
            kept = [position for position, symbol in enumerate(symbols) if symbol is not None]
            for position, following in zip(kept, [*kept[1:], len(symbols)], strict=True):
                start, end = bounds[position], bounds[following]
                ids.append(symbols[position])
                offsets.append((source[char_at[start]], source[char_at[end - 1]] + 1))
                word_ids.append(word_index)
        return ids, offsets, word_ids, len(words)

    def _merged(self, word: str) -> tuple[list[int | None], list[int]]:
        """``word``'s symbols after merging (None where a merge absorbed one) and the byte
        length of each symbol before merging; remembered for short words."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        if self.ignore_merges and word in self._vocab:
            result = [self._vocab[word]], [len(word.encode("utf-8"))]
        else:
            ids, lengths = self._symbols(word)
            result = apply_merges(ids, self._merges.get), lengths
        if len(word) <= _CACHED_WORD_LENGTH:
            if len(self._cache) > CACHE_LIMIT:
                self._cache.clear()
            self._cache[word] = result
        return result

    def _symbols(self, word: str) -> tuple[list[int], list[int]]:
        """The symbols BPE starts from, with their byte lengths, exactly as Hugging Face's
        ``merge_word``: a known character is itself; an unknown one is its byte tokens when
        ``byte_fallback`` has them all, else the unknown token (none without one), a pending
        unknown run being written out only before the next known character or at the end."""
        vocab = self._vocab
        ids = [vocab.get(char) for char in word]
        if None not in ids:
            return ids, [len(char.encode("utf-8")) for char in word]
        ids, lengths = [], []
        unknown: list[int] | None = None  # [unk id, byte length] of the pending unknown run
        for char in word:
            size = len(char.encode("utf-8"))
            token_id = vocab.get(char)
            if token_id is not None:
                if unknown is not None:
                    ids.append(unknown[0])
                    lengths.append(unknown[1])
                    unknown = None
                ids.append(token_id)
                lengths.append(size)
                continue
            if self.byte_fallback:
                byte_ids = [self._byte_ids[byte] for byte in char.encode("utf-8")]
                if None not in byte_ids:
                    ids += byte_ids
                    lengths += [1] * size
                    continue
            if self._unk_id is None:
                continue
            if unknown is not None and self.fuse_unk:
                unknown[1] += size
                continue
            if unknown is not None:
                ids.append(unknown[0])
                lengths.append(unknown[1])
            unknown = [self._unk_id, size]
        if unknown is not None:
            ids.append(unknown[0])
            lengths.append(unknown[1])
        return ids, lengths

    def _decode_ids(self, ids: list[int]) -> str:
        table = self._decode_table
        return self.decoder.decode([table[token_id] for token_id in ids])

    # ---- tokenizer.json -------------------------------------------------------------------------

    def _json_parts(self) -> dict[str, Any]:
        if self.pre_tokenizer is None:
            pre_tokenizer = None
        elif isinstance(self.pre_tokenizer, Metaspace):
            pre_tokenizer = self.pre_tokenizer.pre_tokenizer_json()
        else:
            pre_tokenizer = self.pre_tokenizer.to_json()
        return {
            "normalizer": None if self.normalizer is None else self.normalizer.to_json(),
            "pre_tokenizer": pre_tokenizer,
            "decoder": self.decoder.to_json(),
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": self._unk_token,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": self.fuse_unk,
                "byte_fallback": self.byte_fallback,
                "ignore_merges": self.ignore_merges,
                "vocab": dict(sorted(self._vocab.items(), key=lambda item: item[1])),
                "merges": [list(pair) for pair in self._merge_pairs],
            },
        }
