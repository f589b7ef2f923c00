"""WordPiece, as in BERT: normalize (lower-case, strip accents, space out Chinese characters),
cut into words at whitespace and punctuation, then split each word greedily into the longest
vocabulary pieces from the left, continuations spelled "##piece"; a word with any part not in
the vocabulary becomes "[UNK]" as a whole. Pairs come out as ``[CLS] a [SEP] b [SEP]`` with
``token_type_ids`` 0 then 1. Trainable, readable from BERT's ``vocab.txt`` or a tokenizer.json."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tformer.tokenizers.added_tokens import AddedToken, parse_special_tokens
from tformer.tokenizers.base import VocabularyTokenizer
from tformer.tokenizers.bpe import CACHE_LIMIT
from tformer.tokenizers.corpus import TextsOrFiles, count_words, training_progress
from tformer.tokenizers.encoding import Offset
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.merge_training import learn_merges
from tformer.tokenizers.normalizers import WHITE_SPACE, Alignment, BertNormalizer, Normalizer
from tformer.tokenizers.post_processor import Template
from tformer.tokenizers.pre_tokenizers import BertPreTokenizer, PreTokenizer

BERT_SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


class WordPieceTokenizer(VocabularyTokenizer):
    """WordPiece over ``vocab`` (token → id, or tokens in id order). ``lowercase`` and
    ``strip_accents`` configure BERT's normalizer (accents are stripped when lower-casing unless
    told otherwise); pass ``normalizer`` / ``pre_tokenizer`` to replace BERT's altogether."""

    kind = "wordpiece"
    model_input_names = ("input_ids", "token_type_ids", "attention_mask")

    def __init__(
        self,
        vocab: Mapping[str, int] | Sequence[str],
        *,
        unk_token: str = "[UNK]",
        continuing_subword_prefix: str = "##",
        max_input_chars_per_word: int = 100,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        normalizer: Normalizer | None = None,
        pre_tokenizer: PreTokenizer | None = None,
        added_tokens: Mapping[int, AddedToken] | None = None,
        roles: Mapping[str, str] | None = None,
        template: Template | None = None,
        decoder_cleanup: bool = True,
    ) -> None:
        if not isinstance(vocab, Mapping):
            vocab = {token: token_id for token_id, token in enumerate(vocab)}
        if unk_token not in vocab:
            raise TokenizerError(f"unk_token {unk_token!r} is not in the WordPiece vocabulary")
        self._set_vocabulary(vocab)
        self._unk_token = unk_token
        self._unk_id = self._vocab[unk_token]
        self.prefix = continuing_subword_prefix
        self.max_input_chars_per_word = max_input_chars_per_word
        self.normalizer = normalizer if normalizer is not None else BertNormalizer(
            lowercase=lowercase, strip_accents=strip_accents)
        self.pre_tokenizer = pre_tokenizer if pre_tokenizer is not None else BertPreTokenizer()
        self.decoder_cleanup = decoder_cleanup
        self._cache: dict[str, list[int]] = {}
        self._spans_cache: dict[str, tuple[list[int], list[Offset]]] = {}
        if roles is None and added_tokens is None:
            added_tokens, roles = _bert_specials(self._vocab)
        if template is None:
            roles_given = roles or {}
            if "cls" in roles_given and "sep" in roles_given:
                template = Template.bert(roles_given["cls"], roles_given["sep"])
        super().__init__(added_tokens, roles, template)

    # ---- the model ------------------------------------------------------------------------------

    def _normalize(self, text: str) -> str:
        return self.normalizer(text)

    def _normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        return self.normalizer.normalize_aligned(text)

    def _clear_cache(self) -> None:
        self._cache.clear()
        self._spans_cache.clear()

    def _encode_normalized(self, text: str) -> list[int]:
        cache = self._cache
        if len(cache) > CACHE_LIMIT:
            cache.clear()
        ids: list[int] = []
        for word in self.pre_tokenizer(text):
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = cache[word] = self._split_word(word)
            ids += word_ids
        return ids

    def _encode_normalized_with_offsets(self, text: str) -> tuple[list[int], list[Offset], list[int], int]:
        ids: list[int] = []
        offsets: list[Offset] = []
        word_ids: list[int] = []
        spans = self.pre_tokenizer.spans(text)
        cache = self._spans_cache
        if len(cache) > CACHE_LIMIT:
            cache.clear()
        for word_index, (start, end) in enumerate(spans):
            word = text[start:end]
            entry = cache.get(word)
            if entry is None:
                entry = cache[word] = self._pieces_with_spans(word)
            pieces, piece_spans = entry
            if len(pieces) == 1:  # most words: one token spanning the word
                ids.append(pieces[0])
                word_ids.append(word_index)
                offsets.append((start, end))
                continue
            ids += pieces
            word_ids += [word_index] * len(pieces)
            offsets += [(start + begin, start + stop) for begin, stop in piece_spans]
        return ids, offsets, word_ids, len(spans)

    def _pieces_with_spans(self, word: str) -> tuple[list[int], list[Offset]]:
        """A word's ids and each piece's (start, end) in it; [UNK] spans the whole word."""
        pieces = self._cache.get(word) or self._split_word(word)
        if pieces == [self._unk_id]:
            return pieces, [(0, len(word))]
        spans, position, prefix_length = [], 0, len(self.prefix)
        for index, token_id in enumerate(pieces):
            length = len(self._id_to_token[token_id]) - (prefix_length if index else 0)
            spans.append((position, position + length))
            position += length
        return pieces, spans

    def _split_word(self, word: str) -> list[int]:
        """Greedy longest match from the left; any unmatched remainder makes the word [UNK]."""
        if len(word) > self.max_input_chars_per_word:
            return [self._unk_id]
        vocab, prefix = self._vocab, self.prefix
        ids: list[int] = []
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else prefix + word[start:end]
                token_id = vocab.get(piece)
                if token_id is not None:
                    ids.append(token_id)
                    start = end
                    break
            else:
                return [self._unk_id]
        return ids

    def _decode_ids(self, ids: list[int]) -> str:
        """Tokens joined by spaces, "##" continuations glued on, and (like Hugging Face's
        WordPiece decoder) the space before "." "," "?" "!" and contractions removed."""
        pieces = []
        for index, token_id in enumerate(ids):
            token = self.id_to_token(token_id) or ""  # an id with no token (a gap in the vocabulary)
            if index > 0:
                token = token[len(self.prefix):] if token.startswith(self.prefix) else " " + token
            if self.decoder_cleanup:
                token = _cleanup(token)
            pieces.append(token)
        return "".join(pieces)

    # ---- tokenizer.json -------------------------------------------------------------------------

    def _json_parts(self) -> dict[str, Any]:
        return {
            "normalizer": self.normalizer.to_json(),
            "pre_tokenizer": self.pre_tokenizer.to_json(),
            "decoder": {"type": "WordPiece", "prefix": self.prefix, "cleanup": self.decoder_cleanup},
            "model": {
                "type": "WordPiece",
                "unk_token": self._unk_token,
                "continuing_subword_prefix": self.prefix,
                "max_input_chars_per_word": self.max_input_chars_per_word,
                "vocab": dict(sorted(self._vocab.items(), key=lambda item: item[1])),
            },
        }

    # ---- other files ----------------------------------------------------------------------------

    @classmethod
    def from_vocab_file(cls, path: str | Path, lowercase: bool = True,
                        strip_accents: bool | None = None) -> WordPieceTokenizer:
        """BERT's ``vocab.txt``: one token per line, the id is the line number. Its "[PAD]",
        "[UNK]", "[CLS]", "[SEP]", "[MASK]" become special tokens. ``lowercase`` should match the
        model (True for "uncased" checkpoints); accents are stripped when lower-casing unless
        ``strip_accents`` says otherwise."""
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except (OSError, UnicodeDecodeError) as error:
            raise TokenizerError(f"{path}: cannot read the vocabulary ({error})") from None
        if lines and lines[-1] == "":
            lines.pop()
        vocab: dict[str, int] = {}
        for index, line in enumerate(lines):
            vocab[line.rstrip("".join(WHITE_SPACE))] = index
        if "[UNK]" not in vocab:
            raise TokenizerError(f"{path}: not a WordPiece vocabulary (no [UNK] token)")
        return cls(vocab, lowercase=lowercase, strip_accents=strip_accents)

    def save_vocabulary(self, folder: str | Path) -> Path:
        """Write BERT's ``vocab.txt`` (one token per line, in id order) and a
        ``tokenizer_config.json`` with its normalization, into ``folder``: what ``BertTokenizer`` /
        ``BertTokenizerFast.from_pretrained(folder)`` and ``load(folder)`` read with the same ids.
        Refused where a vocab.txt cannot say it (another normalizer or pre-tokenizer, added tokens
        outside the vocabulary, gaps in the ids); ``save`` (tokenizer.json) holds everything."""
        folder = Path(folder)
        if not folder.is_dir():
            raise TokenizerError(f"cannot save the vocabulary: {folder} is not a folder")
        normalizer = self.normalizer
        if not isinstance(normalizer, BertNormalizer) or not isinstance(self.pre_tokenizer, BertPreTokenizer):
            raise TokenizerError("a vocab.txt holds BERT's normalizer and pre-tokenizer only; this tokenizer has "
                                 f"{type(normalizer).__name__} and {type(self.pre_tokenizer).__name__}: use save()")
        implied = WordPieceTokenizer(self._vocab, lowercase=normalizer.lowercase)
        if (self.prefix != "##" or self._unk_token != "[UNK]" or not normalizer.clean_text
                or not normalizer.handle_chinese_chars or self.template != implied.template
                or self._added != implied._added or self._roles != implied._roles):
            raise TokenizerError("a vocab.txt implies BERT's '##' continuations, '[UNK]', text cleaning, Chinese "
                                 "characters spaced out, and its five special tokens and template; this tokenizer "
                                 "differs: use save() (tokenizer.json)")
        if sorted(self._id_to_token) != list(range(self._size)):
            raise TokenizerError("a vocab.txt numbers tokens by line; this vocabulary has gaps in its ids")
        lines = [self._id_to_token[token_id] for token_id in range(self._size)]
        bad = next((line for line in lines if not line or "\n" in line or line != line.strip()), None)
        if bad is not None:
            raise TokenizerError(f"token {bad!r} cannot be written as a line of vocab.txt")
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": normalizer.lowercase,
                  "strip_accents": normalizer.strip_accents, "tokenize_chinese_chars": normalizer.handle_chinese_chars,
                  "model_max_length": 512}
        path = folder / "vocab.txt"
        for target, text in ((path, "\n".join(lines) + "\n"),
                             (folder / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")):
            temporary = target.with_name(target.name + ".tmp")
            temporary.write_text(text, encoding="utf-8")
            os.replace(temporary, target)
        return path

    # ---- training -------------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts_or_files: TextsOrFiles,
        vocab_size: int,
        min_frequency: int = 2,
        special_tokens: Iterable[str] | dict[str, str] = BERT_SPECIAL_TOKENS,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        limit_alphabet: int | None = 1000,
        progress: bool = False,
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary the way Hugging Face does: BPE merges over words spelled
        ``w ##o ##r ##d``, the merged pieces becoming the vocabulary. Ids: special tokens, then
        the (at most ``limit_alphabet`` most frequent) characters, their "##" forms, then one
        token per merge."""
        specials, roles = parse_special_tokens(special_tokens)
        if "unk" not in roles:
            raise TokenizerError("WordPiece needs an unknown token: include '[UNK]' in special_tokens")
        normalizer = BertNormalizer(lowercase=lowercase, strip_accents=strip_accents)
        pre_tokenizer = BertPreTokenizer()
        word_counts = count_words(texts_or_files, pre_tokenizer, specials, normalize=normalizer)
        char_counts: Counter = Counter()
        for word, count in word_counts.items():
            for char in word:
                char_counts[char] += count
        kept = sorted(char_counts, key=lambda char: (-char_counts[char], char))[:limit_alphabet]
        alphabet = sorted(kept)
        in_alphabet = set(alphabet)
        continuations = sorted({"##" + char for word in word_counts for char in word[1:] if char in in_alphabet})
        vocab = list(dict.fromkeys([*specials, *alphabet, *continuations]))
        if not isinstance(vocab_size, int) or vocab_size < len(vocab):
            raise TokenizerError(
                f"vocab_size={vocab_size} is too small: this corpus needs {len(specials)} special tokens plus "
                f"{len(vocab) - len(specials)} characters and continuations ({len(vocab)}); "
                f"raise vocab_size or lower limit_alphabet"
            )
        token_ids = {token: token_id for token_id, token in enumerate(vocab)}
        words, counts = [], []
        for word, count in word_counts.items():
            pieces = [word[0]] + ["##" + char for char in word[1:]]
            if all(piece in token_ids for piece in pieces):  # words with a dropped rare character stay [UNK]
                words.append([token_ids[piece] for piece in pieces])
                counts.append(count)
        bar = training_progress(progress, vocab_size - len(vocab), "merges")
        learn_merges(words, counts, vocab, vocab_size, min_frequency, _join_pieces,
                     on_merge=None if bar is None else bar.update)
        if bar is not None:
            bar.close()
        return cls(
            vocab,
            unk_token=roles["unk"],
            lowercase=lowercase,
            strip_accents=strip_accents,
            added_tokens={token_id: AddedToken(token) for token_id, token in enumerate(specials)},
            roles=roles,
        )


def _join_pieces(left: str, right: str) -> str:
    return left + (right[2:] if right.startswith("##") else right)


def _bert_specials(vocab: Mapping[str, int]) -> tuple[dict[int, AddedToken], dict[str, str]]:
    """BERT's five special tokens, those the vocabulary has, as added tokens with their roles."""
    present = {role: token for role, token in BERT_SPECIAL_TOKENS.items() if token in vocab}
    return {vocab[token]: AddedToken(token) for token in present.values()}, present


_CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _cleanup(token: str) -> str:
    for dirty, clean in _CLEANUPS:
        token = token.replace(dirty, clean)
    return token
