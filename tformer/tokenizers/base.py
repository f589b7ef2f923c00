"""What every tformer tokenizer shares: added and special tokens, the encode / decode /
encode_batch interface, the post-processing template (``[CLS] A [SEP]``) and saving as a
Hugging Face ``tokenizer.json``. A subclass supplies only its model: how plain text becomes
ids (``_encode_normalized``) and back (``_decode_ids``), and its parts of the json."""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tformer.files import write_text_atomically
from tformer.tokenizers.added_tokens import SPECIAL_ROLES, AddedToken, AddedTokenSplitter, infer_roles
from tformer.tokenizers.batch import (
    BatchEncoding,
    as_tensors,
    check_batch_options,
    pad_rows,
    truncate_pair,
    truncation_lengths,
    truncation_strategy,
    windows,
)
from tformer.tokenizers.encoding import Encoding, Offset
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.normalizers import Alignment
from tformer.tokenizers.post_processor import SEQUENCE_A, SEQUENCE_B, Template

TOKENIZER_FILE = "tokenizer.json"


class Tokenizer:
    """Base class: a model vocabulary (from the subclass) plus added tokens, special-token
    roles and a template. Ids of added tokens may lie inside the model vocabulary (BERT's
    "[CLS]") or after it (a user's new "<tool>")."""

    kind = "base"
    model_input_names: tuple[str, ...] = ("input_ids", "attention_mask")

    def __init__(
        self,
        added_tokens: Mapping[int, AddedToken] | None = None,
        roles: Mapping[str, str] | None = None,
        template: Template | None = None,
    ) -> None:
        self._added: dict[int, AddedToken] = dict(added_tokens or {})
        self.template = template or Template()
        self._refresh_added()
        self._roles: dict[str, str] = {}
        for role, content in (roles or {}).items():
            self._set_role(role, content)
        for content in self.template.special_tokens:
            if self.token_to_id(content) is None:
                raise TokenizerError(f"the template uses {content!r}, which is not in the vocabulary")

    # ---- what a subclass provides -------------------------------------------------------------

    @property
    def _model_size(self) -> int:
        raise NotImplementedError

    def _model_token_to_id(self, token: str) -> int | None:
        raise NotImplementedError

    def _model_id_to_token(self, token_id: int) -> str | None:
        raise NotImplementedError

    def _model_vocab(self) -> dict[str, int]:
        raise NotImplementedError

    def _normalize(self, text: str) -> str:
        """Text as the model sees it (lower-cased, accents stripped...); identity by default."""
        return text

    def _encode_normalized(self, text: str) -> list[int]:
        """Ids of normalized text holding no added token."""
        raise NotImplementedError

    def _encode_piece(self, text: str, first: bool) -> list[int]:
        """``_encode_normalized`` of one piece between added tokens; ``first`` when the piece begins
        the text (Metaspace's prepend_scheme "first" marks a word start there only)."""
        return self._encode_normalized(text)

    def _encode_piece_with_offsets(self, text: str, first: bool) -> tuple[list[int], list[Offset], list[int], int]:
        """``_encode_normalized_with_offsets`` of one piece, ``first`` as in ``_encode_piece``."""
        return self._encode_normalized_with_offsets(text)

    def _normalize_aligned(self, text: str) -> tuple[str, Alignment]:
        """``_normalize`` with where each normalized character comes from (for offsets)."""
        return text, None

    def _encode_normalized_with_offsets(self, text: str) -> tuple[list[int], list[Offset], list[int], int]:
        """``_encode_normalized`` with each token's (start, end) in ``text`` and the index of its
        word among the pre-tokenized words of ``text``; last, how many words there were."""
        raise TokenizerError(f"{type(self).__name__} cannot report offsets")

    def _trim_offsets(self, ids: list[int], offsets: list[Offset]) -> list[Offset]:
        """Offsets of one sequence's tokens (or window of them) as the post-processor leaves
        them; unchanged unless a subclass trims (byte-level BPE's ``trim_offsets``)."""
        return offsets

    def _decode_ids(self, ids: list[int]) -> str:
        """Text of valid ids (special ones included unless already filtered out)."""
        raise NotImplementedError

    def _json_parts(self) -> dict[str, Any]:
        """This model's ``normalizer``, ``pre_tokenizer``, ``decoder`` and ``model`` entries."""
        raise NotImplementedError

    def _clear_cache(self) -> None:
        """Forget memoised word encodings (after the vocabulary changes)."""

    # ---- vocabulary -----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the embedding table a model needs)."""
        return self._vocab_size

    def __len__(self) -> int:
        return self._vocab_size

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token`` (a vocabulary string such as "Ġthe" or "##ing"), or None."""
        token_id = self._added_ids.get(token)
        return token_id if token_id is not None else self._model_token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of ``token_id``, or None when no token has it. An added token
        matched after normalization reads as normalized ("hello world" for "Hello World" in a
        lower-casing tokenizer), as in Hugging Face."""
        added = self._added_text.get(token_id)
        return added if added is not None else self._model_id_to_token(token_id)

    def get_vocab(self) -> dict[str, int]:
        """Every token with its id, added tokens included."""
        vocab = self._model_vocab()
        vocab.update(self._added_ids)
        return vocab

    @property
    def added_tokens(self) -> dict[int, AddedToken]:
        return dict(self._added)

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids

    # ---- special tokens -------------------------------------------------------------------------

    @property
    def special_tokens(self) -> dict[str, str]:
        """Role → token, e.g. {"pad": "[PAD]", "cls": "[CLS]", ...}."""
        return dict(self._roles)

    def special_token(self, role: str) -> str | None:
        _check_role(role)
        return self._roles.get(role)

    def special_token_id(self, role: str) -> int | None:
        token = self.special_token(role)
        return None if token is None else self.token_to_id(token)

    pad_token = property(lambda self: self.special_token("pad"))
    bos_token = property(lambda self: self.special_token("bos"))
    eos_token = property(lambda self: self.special_token("eos"))
    unk_token = property(lambda self: self.special_token("unk"))
    cls_token = property(lambda self: self.special_token("cls"))
    sep_token = property(lambda self: self.special_token("sep"))
    mask_token = property(lambda self: self.special_token("mask"))
    pad_token_id = property(lambda self: self.special_token_id("pad"))
    bos_token_id = property(lambda self: self.special_token_id("bos"))
    eos_token_id = property(lambda self: self.special_token_id("eos"))
    unk_token_id = property(lambda self: self.special_token_id("unk"))
    cls_token_id = property(lambda self: self.special_token_id("cls"))
    sep_token_id = property(lambda self: self.special_token_id("sep"))
    mask_token_id = property(lambda self: self.special_token_id("mask"))

    def add_special_tokens(self, tokens: Mapping[str, str] | Iterable[str]) -> int:
        """Make tokens special (never split, dropped by ``skip_special_tokens``), giving new ones
        the next free ids. A mapping also sets roles: ``add_special_tokens({"pad": "<pad>"})``;
        a plain list gets roles from conventional names ("[PAD]", "<|endoftext|>"...).
        Returns how many new ids were created."""
        if isinstance(tokens, str):
            raise TokenizerError("add_special_tokens takes a list of tokens or a {role: token} mapping, not a str")
        roles = dict(tokens) if isinstance(tokens, Mapping) else None
        contents = list(roles.values()) if roles is not None else list(tokens)
        for role in roles or {}:
            _check_role(role)
        added = self._add(contents, special=True)
        for role, content in (roles if roles is not None else infer_roles(contents)).items():
            if roles is not None or role not in self._roles:
                self._set_role(role, content)
        return added

    def add_tokens(self, tokens: Iterable[str]) -> int:
        """Add ordinary tokens that are never split (matched after normalization). Returns how
        many new ids were created."""
        if isinstance(tokens, str):
            raise TokenizerError("add_tokens takes a list of tokens, not a str")
        return self._add(list(tokens), special=False)

    def _add(self, contents: list[str], special: bool) -> int:
        for content in contents:
            if not isinstance(content, str) or not content:
                raise TokenizerError(f"an added token must be a non-empty str, got {content!r}")
        created = 0
        for content in dict.fromkeys(contents):
            token_id = self.token_to_id(content)
            if token_id is None:
                token_id = self._vocab_size + created
                created += 1
            elif token_id in self._added and self._added[token_id].special == special:
                continue
            self._added[token_id] = AddedToken(content, special=special, normalized=not special)
            self._added_ids[content] = token_id
        self._refresh_added()
        self._clear_cache()
        return created

    def _set_role(self, role: str, content: str) -> None:
        _check_role(role)
        if self.token_to_id(content) is None:
            raise TokenizerError(f"special token {role}={content!r} is not in the vocabulary")
        self._roles[role] = content

    def _refresh_added(self) -> None:
        self._added_ids = {token.content: token_id for token_id, token in self._added.items()}
        self._added_text = {token_id: self._normalize(token.content) if token.normalized else token.content
                            for token_id, token in self._added.items()}
        self._special_ids = frozenset(token_id for token_id, token in self._added.items() if token.special)
        splitter = AddedTokenSplitter(self._added, self._normalize)
        self._splitter = None if splitter.empty else splitter
        self._vocab_size = max(self._model_size, max(self._added, default=-1) + 1)
        self._tokens_by_id: list[str | None] | None = None

    # ---- encoding -------------------------------------------------------------------------------

    def encode(self, text: str, pair: str | None = None, add_special_tokens: bool = True) -> list[int]:
        """Ids of ``text`` (and ``pair``), with the special tokens the model's template adds
        (``[CLS] … [SEP]`` for BERT's WordPiece, none for GPT-2's BPE) unless told not to."""
        ids = self._encode_text(text)
        if pair is None and not (add_special_tokens and self.template.adds_tokens):
            return ids
        ids_b = None if pair is None else self._encode_text(pair, "pair")
        return self._combine(ids, ids_b, add_special_tokens)[0]

    def tokenize(self, text: str, pair: str | None = None, add_special_tokens: bool = False) -> list[str]:
        """The vocabulary strings ``encode`` would give ids for (for display)."""
        return [self.id_to_token(token_id) for token_id in self.encode(text, pair, add_special_tokens)]

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
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
            raise TokenizerError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be a positive integer")
        if not isinstance(stride, int) or stride < 0:
            raise TokenizerError(f"stride={stride!r} must be an integer >= 0")
        strategy = truncation_strategy(truncation)
        check_list = _check_word_lists if is_split_into_words else _check_text_list
        texts = check_list(texts, "texts")
        if pairs is not None:
            pairs = check_list(pairs, "pairs")
            if len(pairs) != len(texts):
                raise TokenizerError(f"got {len(texts)} texts but {len(pairs)} pairs; they must match one to one")
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
        encode_text = self._encode_text
        if pairs is None and budget is None and not (add_special_tokens and self.template.adds_tokens):
            ids_rows = self._encode_texts(texts)  # the common case, kept lean
            type_rows = [[0] * len(row) for row in ids_rows] if with_types else []
        else:
            ids_rows, type_rows = [], []
            for index, text in enumerate(texts):
                ids_a = encode_text(text)
                ids_b = None if pairs is None else encode_text(pairs[index], "pair")
                if budget is not None:
                    ids_a, ids_b = truncate_pair(ids_a, ids_b, budget, truncation_side, strategy)
                ids, type_ids = self._combine(ids_a, ids_b, add_special_tokens)
                ids_rows.append(ids)
                type_rows.append(type_ids)

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

    def _truncation_budget(self, max_length: int, pair: bool, add_special_tokens: bool) -> int:
        """How many text tokens fit ``max_length`` beside the template's special tokens."""
        specials = self.template.num_special_tokens(pair) if add_special_tokens else 0
        budget = max_length - specials
        if budget < 1:
            raise TokenizerError(f"max_length={max_length} leaves no room for text: "
                                 f"the template adds {specials} special tokens")
        return budget

    @staticmethod
    def _padded_length(padding: bool | str, max_length: int | None, multiple_of: int | None, lengths) -> int:
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
            text = _check_word_lists([text], "text")[0]
            pair = None if pair is None else _check_word_lists([pair], "pair")[0]
        strategy = truncation_strategy(truncation)
        budget = None if strategy is None else self._truncation_budget(max_length, pair is not None,
                                                                       add_special_tokens)
        return self._encode_plus(text, pair, add_special_tokens, strategy, budget, stride, truncation_side,
                                 is_split_into_words)

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

    def _assemble(self, part_a, window_a, part_b, window_b, add_special_tokens: bool) -> Encoding:
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

    def _encode_text_with_offsets(self, text: str, what: str = "text") -> tuple[list[int], list[Offset], list[int]]:
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

    def _encode_words_with_offsets(self, words: list[str], what: str = "text") -> tuple[list, list, list]:
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

    def _combine(self, ids_a: list[int], ids_b: list[int] | None, add_special_tokens: bool) -> tuple[list, list]:
        if add_special_tokens:
            return self.template.apply(ids_a, ids_b, self._template_token_id)
        type_ids = [0] * len(ids_a)
        if ids_b is None:
            return ids_a, type_ids
        return ids_a + ids_b, type_ids + [self.template.plain_pair_type_id] * len(ids_b)

    def _template_token_id(self, token: str) -> int:
        token_id = self.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"the template uses {token!r}, which is not in the vocabulary")
        return token_id

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        """The ids of each of ``texts`` (already checked to be str); subclasses may speed it up."""
        return [self._encode_text(text) for text in texts]

    def _encode_text(self, text: str, what: str = "text") -> list[int]:
        """Ids of one text: added tokens found first, the model encodes what lies between."""
        if not isinstance(text, str):
            raise TokenizerError(f"{what} must be a str, got {type(text).__name__}")
        splitter = self._splitter
        if splitter is None or not splitter.could_match(text):
            return self._encode_normalized(self._normalize(text))
        ids: list[int] = []
        for index, (piece, token_id) in enumerate(splitter.split(text)):
            if token_id is None:
                ids += self._encode_piece(piece, index == 0)
            else:
                ids.append(token_id)
        return ids

    # ---- decoding -------------------------------------------------------------------------------

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (a list, or a 1-D tensor / array); special tokens are kept
        unless ``skip_special_tokens``."""
        ids = self._check_ids(ids)
        if skip_special_tokens and self._special_ids:
            special = self._special_ids
            ids = [token_id for token_id in ids if token_id not in special]
        return self._decode_ids(ids)

    def decode_batch(self, rows: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        """``decode`` of each row (a list of lists, or a 2-D tensor / array)."""
        if hasattr(rows, "tolist"):
            rows = rows.tolist()
        return [self.decode(row, skip_special_tokens) for row in rows]

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        if isinstance(ids, (str, bytes)):
            raise TokenizerError(f"decode takes token ids, got {type(ids).__name__}")
        ids = list(ids)
        if not all(type(token_id) is int for token_id in ids):
            bad = next(token_id for token_id in ids if type(token_id) is not int)
            if isinstance(bad, (list, tuple)):
                raise TokenizerError("decode takes one sequence of ids; use decode_batch for several")
            try:
                ids = [operator.index(token_id) for token_id in ids]
            except TypeError:
                raise TokenizerError(f"token ids must be integers, got {bad!r}") from None
        if ids and (min(ids) < 0 or max(ids) >= self._vocab_size):
            bad = next(token_id for token_id in ids if not 0 <= token_id < self._vocab_size)
            raise TokenizerError(f"token id {bad} is out of range: this vocabulary has ids 0..{self._vocab_size - 1}")
        return ids

    # ---- saving ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """This tokenizer as a Hugging Face ``tokenizer.json`` document."""
        roles_of: dict[str, list[str]] = {}
        for role, content in self._roles.items():
            roles_of.setdefault(content, []).append(role)
        parts = self._json_parts()
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [token.to_json(token_id, roles_of.get(token.content, ()))
                             for token_id, token in sorted(self._added.items())],
            "normalizer": parts["normalizer"],
            "pre_tokenizer": parts["pre_tokenizer"],
            "post_processor": self._post_processor_json(),
            "decoder": parts["decoder"],
            "model": parts["model"],
        }

    def _post_processor_json(self) -> dict:
        return self.template.to_json(self._template_token_id)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` (to ``path``, or into ``path`` when it is a folder), readable
        by ``tformer.tokenizers.load`` and by the Hugging Face ``tokenizers`` library."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.parent.is_dir():
            raise TokenizerError(f"cannot save the tokenizer to {path}: folder {path.parent} does not exist")
        text = json.dumps(self.to_dict(), ensure_ascii=False)
        return write_text_atomically(path, text + "\n")

    def fingerprint(self) -> str:
        """SHA-256 of the canonical json: equal fingerprints mean equal tokenization."""
        canonical = json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        specials = ", ".join(f"{role}={token!r}" for role, token in self._roles.items())
        return f"{type(self).__name__}(vocab_size={self._vocab_size}{', ' + specials if specials else ''})"


def _check_role(role: str) -> None:
    if role not in SPECIAL_ROLES:
        raise TokenizerError(f"unknown special token role {role!r}; known: {', '.join(SPECIAL_ROLES)}")


def _check_word_lists(texts: Sequence[Sequence[str]], what: str) -> list[list[str]]:
    """Texts given as lists of words (``is_split_into_words``)."""
    if isinstance(texts, str):
        raise TokenizerError(f"{what} must be lists of words with is_split_into_words=True, got one str")
    rows = []
    for index, words in enumerate(texts):
        if isinstance(words, str) or not isinstance(words, Sequence):
            raise TokenizerError(f"{what}[{index}] must be a list of words with is_split_into_words=True, "
                                 f"got {type(words).__name__}")
        rows.append(_check_text_list(words, f"{what}[{index}]"))
    return rows


def _check_text_list(texts: Sequence[str], what: str) -> list[str]:
    if isinstance(texts, str):
        raise TokenizerError(f"{what} must be a list of str, got one str; use encode for a single text")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TokenizerError(f"{what}[{index}] must be a str, got {type(text).__name__}")
    return texts


class VocabularyTokenizer(Tokenizer):
    """A tokenizer whose model vocabulary is a token -> id table (BPE, WordPiece)."""

    def _set_vocabulary(self, vocab: Mapping[str, int]) -> None:
        self._vocab = dict(vocab)
        self._id_to_token = {token_id: token for token, token_id in self._vocab.items()}
        self._size = max(self._id_to_token, default=-1) + 1

    @property
    def _model_size(self) -> int:
        return self._size

    def _model_token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def _model_id_to_token(self, token_id: int) -> str | None:
        return self._id_to_token.get(token_id)

    def _model_vocab(self) -> dict[str, int]:
        return dict(self._vocab)
