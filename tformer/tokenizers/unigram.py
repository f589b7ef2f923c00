"""SentencePiece's Unigram model, as Hugging Face's ``tokenizers`` runs it (T5's and Marian's
``tokenizer.json``): text normalized (usually SentencePiece's precompiled map), spaces made
"▁" and a "▁" put before each word (Metaspace), then each word cut into the pieces whose
summed log-probabilities are highest (Viterbi). A character no piece covers is unknown;
neighbouring unknowns fuse into one unknown token. Read and written as tokenizer.json; not
trainable here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from tformer.tokenizers.added_tokens import AddedToken
from tformer.tokenizers.base import Tokenizer
from tformer.tokenizers.bpe import CACHE_LIMIT
from tformer.tokenizers.encoding import Offset
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.normalizers import Alignment, NoNormalizer, Normalizer
from tformer.tokenizers.post_processor import Template
from tformer.tokenizers.pre_tokenizers import WhitespaceSplitPreTokenizer

# Hugging Face scores an unknown character this far below the lowest-scoring piece.
UNKNOWN_PENALTY = 10.0
PREPEND_SCHEMES = ("always", "first", "never")


class Metaspace:
    """Hugging Face's Metaspace pre-tokenizer and decoder: spaces become ``replacement``, one is
    put before text that does not start with it (``prepend_scheme`` "always"; "first": only
    before the text's first piece, not after an added token), and with ``split`` the text is
    cut before each ``replacement``. ``whitespace_split`` first cuts at whitespace (T5's
    ``Sequence[WhitespaceSplit, Metaspace]``)."""

    def __init__(self, replacement: str = "▁", prepend_scheme: str = "always", split: bool = True,
                 whitespace_split: bool = False) -> None:
        if len(replacement) != 1:
            raise TokenizerError(f"Metaspace replacement must be one character, got {replacement!r}")
        if prepend_scheme not in PREPEND_SCHEMES:
            raise TokenizerError(f"Metaspace prepend_scheme {prepend_scheme!r} is not supported; known: "
                                 f"{', '.join(PREPEND_SCHEMES)}")
        self.replacement = replacement
        self.prepend_scheme = prepend_scheme
        self.split = split
        self.whitespace_split = whitespace_split
        self._whitespace = WhitespaceSplitPreTokenizer() if whitespace_split else None

    def words(self, text: str, first: bool = True) -> list[str]:
        """The words of ``text``; ``first`` when it begins the whole text (for scheme "first")."""
        return [word for word, _ in self.cut(text, first, sources=False)]

    def words_with_sources(self, text: str, first: bool = True) -> list[tuple[str, list[int]]]:
        """Each word and, for each of its characters, the index in ``text`` it stands for (a
        mark put before a section stands for the section's first character, as in Hugging Face)."""
        return self.cut(text, first, sources=True)

    def cut(self, text: str, first: bool, sources: bool) -> list[tuple[str, list[int] | None]]:
        """The words of ``text``, each with its characters' indices in ``text`` when ``sources``."""
        if self._whitespace is None:
            return self._section_words(text, 0, sources, first)
        words: list[tuple[str, list[int] | None]] = []
        for start, end in self._whitespace.spans(text):
            words += self._section_words(text[start:end], start, sources, first and start == 0)
        return words

    def _section_words(self, text: str, offset: int, sources: bool, first: bool) -> list[tuple[str, list[int] | None]]:
        mark = self.replacement
        text = text.replace(" ", mark)
        source = list(range(offset, offset + len(text))) if sources else None
        prepend = self.prepend_scheme == "always" or (first and self.prepend_scheme == "first")
        if text and prepend and not text.startswith(mark):
            text = mark + text
            if sources:
                source.insert(0, offset)
        if not text:
            return []
        cuts = [0] + [index for index, char in enumerate(text) if char == mark and index > 0] if self.split else [0]
        cuts.append(len(text))
        return [(text[start:end], None if source is None else source[start:end]) for start, end in pairwise(cuts)
                if end > start]

    def decode(self, tokens: list[str]) -> str:
        """Marks back to spaces; the one put before the text is dropped."""
        text = "".join(tokens).replace(self.replacement, " ")
        if self.prepend_scheme != "never" and text.startswith(" "):
            text = text[1:]
        return text

    def pre_tokenizer_json(self) -> dict:
        metaspace = {"type": "Metaspace", "replacement": self.replacement, "prepend_scheme": self.prepend_scheme,
                     "split": self.split}
        if not self.whitespace_split:
            return metaspace
        return {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, metaspace]}

    def decoder_json(self) -> dict:
        return {"type": "Metaspace", "replacement": self.replacement, "prepend_scheme": self.prepend_scheme,
                "split": self.split}


class UnigramTokenizer(Tokenizer):
    """Unigram over ``pieces`` ((piece, log-probability) in id order); ``unk_id`` is the id of
    the unknown piece."""

    kind = "unigram"

    def __init__(
        self,
        pieces: Sequence[tuple[str, float]],
        *,
        unk_id: int,
        metaspace: Metaspace | None = None,
        normalizer: Normalizer | None = None,
        added_tokens: Mapping[int, AddedToken] | None = None,
        roles: Mapping[str, str] | None = None,
        template: Template | None = None,
    ) -> None:
        self._pieces = [(str(piece), float(score)) for piece, score in pieces]
        if not self._pieces:
            raise TokenizerError("a Unigram vocabulary needs at least one piece")
        if not isinstance(unk_id, int) or not 0 <= unk_id < len(self._pieces):
            raise TokenizerError(f"Unigram unk_id {unk_id!r} is not an id of its {len(self._pieces)} pieces")
        self._unk_id = unk_id
        # A piece listed twice answers with its last id and score, as Hugging Face's table does.
        self._vocab = {piece: token_id for token_id, (piece, _) in enumerate(self._pieces)}
        self._scores = {piece: self._pieces[token_id][1] for piece, token_id in self._vocab.items()}
        self._unknown_score = min(score for _, score in self._pieces) - UNKNOWN_PENALTY
        self._longest = max(len(piece) for piece, _ in self._pieces)
        self.metaspace = metaspace if metaspace is not None else Metaspace()
        self.normalizer = normalizer if normalizer is not None else NoNormalizer()
        self._cache: dict[str, list[int]] = {}
        super().__init__(added_tokens, roles, template)

    # ---- the vocabulary -------------------------------------------------------------------------

    @property
    def _model_size(self) -> int:
        return len(self._pieces)

    def _model_token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def _model_id_to_token(self, token_id: int) -> str | None:
        return self._pieces[token_id][0] if 0 <= token_id < len(self._pieces) else None

    def _model_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    # ---- the model ------------------------------------------------------------------------------

    def _normalize(self, text: str) -> str:
        return self.normalizer(text)

    def _normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        return self.normalizer.normalize_aligned(text)

    def _clear_cache(self) -> None:
        self._cache.clear()

    def _encode_normalized(self, text: str) -> list[int]:
        return self._encode_piece(text, True)

    def _encode_piece(self, text: str, first: bool) -> list[int]:
        ids: list[int] = []
        for word in self.metaspace.words(text, first):
            ids += [token_id for _, _, token_id in self._cut(word)]
        return ids

    def _encode_normalized_with_offsets(self, text: str) -> tuple[list[int], list[Offset], list[int], int]:
        return self._encode_piece_with_offsets(text, True)

    def _encode_piece_with_offsets(self, text: str, first: bool) -> tuple[list[int], list[Offset], list[int], int]:
        ids: list[int] = []
        offsets: list[Offset] = []
        word_ids: list[int] = []
        words = self.metaspace.words_with_sources(text, first)
        for word_index, (word, source) in enumerate(words):
            for start, end, token_id in self._cut(word):
                ids.append(token_id)
                offsets.append((source[start], source[end - 1] + 1))
                word_ids.append(word_index)
        return ids, offsets, word_ids, len(words)

    def _cut(self, word: str) -> list[tuple[int, int, int]]:
        """``word``'s pieces as (start, end, id), remembered."""
        cache = self._cache
        pieces = cache.get(word)
        if pieces is None:
            if len(cache) > CACHE_LIMIT:
                cache.clear()
            pieces = cache[word] = self._segment(word)
        return pieces

    def _segment(self, word: str) -> list[tuple[int, int, int]]:
        """The highest-scoring cut of ``word`` into pieces (ties keep the cut found first, as
        Hugging Face does), each run of unknown characters fused into one unknown token."""
        scores, unknown_id, unknown_score = self._scores, self._unk_id, self._unknown_score
        length = len(word)
        # best[end] = (score of the best cut of word[:end], start of its last piece, that piece's id)
        best: list[tuple[float, int, int] | None] = [None] * (length + 1)
        best[0] = (0.0, 0, -1)
        for start in range(length):
            score_here = best[start][0]
            covered = False
            for end in range(start + 1, min(length, start + self._longest) + 1):
                piece = word[start:end]
                score = scores.get(piece)
                if score is None:
                    continue
                covered = covered or end == start + 1
                candidate = score + score_here
                if best[end] is None or candidate > best[end][0]:
                    best[end] = (candidate, start, self._vocab[piece])
            if not covered:
                candidate = unknown_score + score_here
                if best[start + 1] is None or candidate > best[start + 1][0]:
                    best[start + 1] = (candidate, start, unknown_id)
        spans: list[tuple[int, int, bool]] = []  # (start, end, unknown), last piece first
        end = length
        while end > 0:
            _, start, token_id = best[end]
            unknown = token_id == unknown_id
            if unknown and spans and spans[-1][2]:
                spans[-1] = (start, spans[-1][1], True)
            else:
                spans.append((start, end, unknown))
            end = start
        return [(start, end, self._vocab.get(word[start:end], unknown_id)) for start, end, _ in reversed(spans)]

    def _decode_ids(self, ids: list[int]) -> str:
        return self.metaspace.decode([self._pieces[token_id][0] for token_id in ids])

    # ---- tokenizer.json -------------------------------------------------------------------------

    def _json_parts(self) -> dict[str, Any]:
        return {
            "normalizer": self.normalizer.to_json(),
            "pre_tokenizer": self.metaspace.pre_tokenizer_json(),
            "decoder": self.metaspace.decoder_json(),
            "model": {"type": "Unigram", "unk_id": self._unk_id, "vocab": [list(entry) for entry in self._pieces],
                      "byte_fallback": False},
        }
