"""Tokenizers: byte-level BPE (GPT-2, Llama 3, Qwen2), WordPiece (BERT) and characters, trainable;
SentencePiece-style BPE (Llama 2, Mistral, Gemma) and Unigram (T5, Marian), read and written;
all exact against the vocabularies people already have, and stored as Hugging Face ``tokenizer.json``.

``load(path)`` reads any supported file or folder; ``train(kind, corpus, vocab_size)`` learns
a new one. Every tokenizer has ``encode``, ``decode``, ``encode_batch``, ``save``, ``vocab_size``;
``encode_plus`` (and ``encode_batch(..., return_offsets_mapping=True)`` ...) gives an
:class:`Encoding` with offsets, word ids, sequence ids and overflowing windows."""

from __future__ import annotations

from tformer.tokenizers.added_tokens import SPECIAL_ROLES, AddedToken
from tformer.tokenizers.base import Tokenizer
from tformer.tokenizers.batch import BatchEncoding
from tformer.tokenizers.bpe import BPETokenizer
from tformer.tokenizers.char import CharTokenizer
from tformer.tokenizers.corpus import TextsOrFiles
from tformer.tokenizers.encoding import Encoding
from tformer.tokenizers.errors import TokenizerError
from tformer.tokenizers.loader import from_dict, load
from tformer.tokenizers.sentencepiece_bpe import SentencePieceBPETokenizer
from tformer.tokenizers.wordpiece import WordPieceTokenizer

KINDS: dict[str, type[Tokenizer]] = {"bpe": BPETokenizer, "wordpiece": WordPieceTokenizer, "char": CharTokenizer}


def train(kind: str, texts_or_files: TextsOrFiles, vocab_size: int | None = None, **options) -> Tokenizer:
    """Train a tokenizer of ``kind`` ("bpe", "wordpiece" or "char") on str texts and/or Path
    files; ``options`` go to that class's ``train`` (min_frequency, special_tokens, ...)."""
    if kind not in KINDS:
        raise TokenizerError(f"unknown tokenizer kind {kind!r}; known: {', '.join(KINDS)}")
    if vocab_size is None and kind != "char":
        raise TokenizerError(f"training a {kind} tokenizer needs vocab_size")
    return KINDS[kind].train(texts_or_files, vocab_size, **options)


__all__ = [
    "KINDS", "SPECIAL_ROLES", "AddedToken", "BPETokenizer", "BatchEncoding", "CharTokenizer", "Encoding",
    "SentencePieceBPETokenizer", "Tokenizer", "TokenizerError", "WordPieceTokenizer", "from_dict", "load", "train",
]
