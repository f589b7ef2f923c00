"""What every tformer tokenizer shares: the vocabulary (the model's plus added tokens), the
encode / decode interface, the post-processing template (``[CLS] A [SEP]``) and saving as a
Hugging Face ``tokenizer.json``. A subclass supplies only its model: how plain text becomes
ids (``_encode_normalized``) and back (``_decode_ids``), and its parts of the json.

The rest of ``Tokenizer`` lives beside it, one concern a module: added and special tokens
(``special_tokens``), ``encode_plus`` with offsets and windows (``encode_plus``) and
``encode_batch`` with truncation and padding (``encode_batch``)."""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tformer.files import write_text_atomically
from tformer.tokenizers.added_tokens import AddedToken
from tformer.tokenizers.encode_batch import EncodeBatchMixin
from tformer.tokenizers.encode_plus import EncodePlusMixin
from tformer.tokenizers.encoding import Offset
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.normalizers import Alignment
from tformer.tokenizers.post_processor import Template
from tformer.tokenizers.special_tokens import SpecialTokensMixin

TOKENIZER_FILE = "tokenizer.json"


class Tokenizer(SpecialTokensMixin, EncodePlusMixin, EncodeBatchMixin):
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
