"""A character-level tokenizer: one id per distinct character of the training text (the
demo's). Saved as a Hugging Face tokenizer.json (a WordLevel model over single characters), so
the `tokenizers` library reads it with the same ids; tformer's older "Char" layout still loads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tformer.tokenizers.added_tokens import AddedToken, infer_roles, parse_special_tokens
from tformer.tokenizers.base import Tokenizer
from tformer.tokenizers.corpus import TextsOrFiles, iter_texts
from tformer.tokenizers.errors import TokenizerError

UNK = "<unk>"
# Hugging Face's Split pre-tokenizer with this regex isolates every character, newlines included.
CHAR_SPLIT = {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", "invert": False}


class CharTokenizer(Tokenizer):
    """Maps each known character to an id; unknown characters map to the unknown token.
    Ids: special tokens first (``<unk>`` is 0 by default), then the characters."""

    kind = "char"

    def __init__(
        self,
        characters: Iterable[str],
        special_tokens: Sequence[str] | Mapping[str, str] = (UNK,),
        roles: Mapping[str, str] | None = None,
    ) -> None:
        specials, inferred = parse_special_tokens(special_tokens)
        roles = dict(roles if roles is not None else inferred)
        if "unk" not in roles:
            raise TokenizerError("a character tokenizer needs an unknown token: include '<unk>' in special_tokens")
        chars = [char for char in dict.fromkeys(characters) if char not in specials]
        for char in chars:
            if len(char) != 1:
                raise TokenizerError(f"a character tokenizer's vocabulary holds single characters, got {char!r}")
        self.id_to_char = [*specials, *chars]
        self.char_to_id = {token: token_id for token_id, token in enumerate(self.id_to_char)}
        self._unk_id = self.char_to_id[roles["unk"]]
        super().__init__({self.char_to_id[token]: AddedToken(token) for token in specials}, roles)

    @classmethod
    def train(
        cls,
        texts_or_files: TextsOrFiles,
        vocab_size: int | None = None,
        special_tokens: Sequence[str] | Mapping[str, str] = (UNK,),
        progress: bool = False,
    ) -> CharTokenizer:
        """The distinct characters of the corpus in code point order; with ``vocab_size``, only
        the most frequent characters that fit beside the special tokens. (``progress`` is
        accepted like the other trainers'; counting characters needs no progress bar.)"""
        specials, _ = parse_special_tokens(special_tokens)
        counts: Counter = Counter()
        for text in iter_texts(texts_or_files):
            counts.update(text)
        for token in specials:
            counts.pop(token, None)
        if not counts:
            raise TokenizerError("empty corpus: no text to train on")
        chars = sorted(counts)
        if vocab_size is not None:
            room = vocab_size - len(specials)
            if room < 1:
                raise TokenizerError(f"vocab_size={vocab_size} is too small: it must exceed the "
                                     f"{len(specials)} special tokens")
            chars = sorted(sorted(counts, key=lambda char: (-counts[char], char))[:room])
        return cls(chars, special_tokens)

    @property
    def _model_size(self) -> int:
        return len(self.id_to_char)

    def _model_token_to_id(self, token: str) -> int | None:
        return self.char_to_id.get(token)

    def _model_id_to_token(self, token_id: int) -> str | None:
        return self.id_to_char[token_id] if 0 <= token_id < len(self.id_to_char) else None

    def _model_vocab(self) -> dict[str, int]:
        return dict(self.char_to_id)

    def _encode_normalized(self, text: str) -> list[int]:
        get, unk = self.char_to_id.get, self._unk_id
        return [get(char, unk) for char in text]

    def _encode_normalized_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[int], int]:
        return (self._encode_normalized(text), [(index, index + 1) for index in range(len(text))],
                list(range(len(text))), len(text))

    def _decode_ids(self, ids: list[int]) -> str:
        tokens = self.id_to_char
        return "".join([tokens[token_id] for token_id in ids])

    def _json_parts(self) -> dict[str, Any]:
        return {
            "normalizer": None,
            "pre_tokenizer": CHAR_SPLIT,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": dict(self.char_to_id), "unk_token": self.special_token("unk")},
        }

    @classmethod
    def from_dict(cls, data: dict) -> CharTokenizer:
        """A tokenizer.json of this kind (WordLevel over single characters), or tformer's
        older layout ``{"model": {"type": "Char", "vocab": [...]}}``."""
        model = data["model"]
        if model.get("type") == "Char":
            unk = model.get("unk_token", UNK)
            return cls([token for token in model["vocab"] if token != unk], special_tokens=(unk,))
        vocab = model["vocab"]
        by_id = sorted(vocab, key=vocab.get)
        if [vocab[token] for token in by_id] != list(range(len(by_id))):
            raise TokenizerError("a character vocabulary must have ids 0..n-1 without gaps")
        added = {entry["content"]: entry for entry in data.get("added_tokens", [])}
        specials = [token for token in by_id if token in added and added[token].get("special", True)]
        roles = {role: entry["content"] for entry in added.values() for role in entry.get("tformer_roles", [])}
        roles = roles or infer_roles(specials)
        roles.setdefault("unk", model.get("unk_token") or UNK)
        if by_id[:len(specials)] != specials:
            raise TokenizerError("a character vocabulary must list its special tokens first")
        return cls(by_id[len(specials):], special_tokens=specials, roles=roles)
