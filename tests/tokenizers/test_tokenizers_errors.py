"""Bad input: each mistake raises TokenizerError (a TformerError) whose message names the
problem and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tformer.errors import TformerError
from tformer.tokenizers import BPETokenizer, CharTokenizer, TokenizerError, WordPieceTokenizer, load, train


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    return BPETokenizer.train("a small corpus for a small tokenizer", vocab_size=270, min_frequency=1)


def test_tokenizer_error_is_a_tformer_error():
    assert issubclass(TokenizerError, TformerError)


def test_vocab_too_small_for_bytes_and_specials():
    with pytest.raises(TokenizerError, match=r"vocab_size=257 is too small: .*256 byte tokens plus 2 special tokens, "
                                             r"at least 258"):
        BPETokenizer.train("some text", vocab_size=257, special_tokens=["<|endoftext|>", "<pad>"])
    with pytest.raises(TokenizerError, match="vocab_size=10 is too small"):
        WordPieceTokenizer.train("some text with many different letters", vocab_size=10)
    with pytest.raises(TokenizerError, match="vocab_size=1 is too small"):
        CharTokenizer.train("abc", vocab_size=1)


@pytest.mark.parametrize("corpus", ["", [], ["", ""]])
def test_empty_corpus(corpus):
    with pytest.raises(TokenizerError, match="empty corpus"):
        BPETokenizer.train(corpus, vocab_size=300)
    with pytest.raises(TokenizerError, match="empty corpus"):
        CharTokenizer.train(corpus)


def test_empty_corpus_file(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(TokenizerError, match="empty corpus"):
        WordPieceTokenizer.train(tmp_path / "empty.txt", vocab_size=300)
    (tmp_path / "blank.txt").write_text("   \n\n  ")
    with pytest.raises(TokenizerError, match="empty corpus: the training texts hold no words"):
        WordPieceTokenizer.train(tmp_path / "blank.txt", vocab_size=300)


def test_missing_and_undecodable_corpus_files(tmp_path):
    with pytest.raises(TokenizerError, match="nothere.txt: no such file"):
        BPETokenizer.train(tmp_path / "nothere.txt", vocab_size=300)
    (tmp_path / "binary.txt").write_bytes(b"caf\xe9 latin-1, not utf-8")
    with pytest.raises(TokenizerError, match="binary.txt: not UTF-8 text"):
        BPETokenizer.train(tmp_path / "binary.txt", vocab_size=300)
    with pytest.raises(TokenizerError, match="a corpus item must be a str .* or a Path .*got int"):
        BPETokenizer.train([3], vocab_size=300)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not a readable tokenizer file"),
        (b"\xff\xfe\x00garbage", "not a readable tokenizer file"),
        (b"[1, 2, 3]", "not a tokenizer.json"),
        (b'{"model": {"type": "WordLevelish", "vocab": []}}',
         "unknown tokenizer model type 'WordLevelish'; known: BPE"),
        (b'{"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]], "unk_id": 0, "byte_fallback": true}}',
         "Unigram with byte_fallback=true is not supported"),
        (b'{"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]], "unk_id": 0}, "pre_tokenizer": {"type": '
         b'"Metaspace", "prepend_scheme": "sometimes"}}',
         "Metaspace prepend_scheme 'sometimes' is not supported; known: always, first, never"),
        (b'{"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]], "unk_id": 0}, "pre_tokenizer": {"type": '
         b'"Metaspace"}, "decoder": {"type": "ByteLevel"}}',
         "Unigram decoder 'ByteLevel' is not supported; known: Metaspace"),
        (b'{"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]], "unk_id": 3}, "pre_tokenizer": {"type": '
         b'"Metaspace"}, "decoder": {"type": "Metaspace"}}', "Unigram unk_id 3 is not an id of its 1 pieces"),
        (b'{"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]], "unk_id": 0}, "pre_tokenizer": {"type": '
         b'"Metaspace"}, "decoder": {"type": "Metaspace"}, "normalizer": {"type": "Precompiled", '
         b'"precompiled_charsmap": "not base64!"}}', "precompiled_charsmap is not valid base64"),
        (b'{"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]], "unk_id": 0}, "pre_tokenizer": {"type": '
         b'"Metaspace"}, "decoder": {"type": "Metaspace"}, "normalizer": {"type": "Replace", "pattern": '
         b'{"Regex": " +"}, "content": " "}}', "Replace normalizer with pattern .* is not supported; only a String"),
        (b'{"model": {"type": "BPE", "vocab": {}, "merges": [], "byte_fallback": true}, "decoder": {"type": '
         b'"ByteLevel"}}', "byte-level BPE with byte_fallback=true is not supported"),
        (b'{"model": {"type": "BPE", "vocab": {}, "merges": []}, "decoder": {"type": "Metaspace"}, '
         b'"pre_tokenizer": {"type": "ByteLevel"}}', "byte-level BPE decoder 'Metaspace' is not supported; known: "
         "ByteLevel"),
        (b'{"model": {"type": "BPE", "vocab": {}, "merges": []}, "decoder": {"type": "CTC"}}',
         "decoder 'CTC' is not supported for SentencePiece-style BPE; known: Sequence, Replace, ByteFallback"),
        (b'{"model": {"type": "BPE", "vocab": {}, "merges": []}}',
         "decoder None is not supported for SentencePiece-style BPE"),
        (b'{"model": {"type": "BPE", "vocab": {}, "merges": [], "continuing_subword_prefix": "##"}, "decoder": '
         b'{"type": "Fuse"}}', "BPE with continuing_subword_prefix='##' is not supported; allowed: None or ''"),
        (b'{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}}, "pre_tokenizer": {"type": "Metaspace"}}',
         "WordPiece pre_tokenizer 'Metaspace' is not supported; known: BertPreTokenizer"),
        (b'{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}}, "normalizer": {"type": "NFKCish"}, '
         b'"pre_tokenizer": {"type": "BertPreTokenizer"}}', "normalizer 'NFKCish' is not supported"),
        (b'{"model": {"type": "WordPiece", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "BertPreTokenizer"}}',
         "unk_token '\\[UNK\\]' is not in the WordPiece vocabulary"),
        (b'{"model": {"type": "BPE", "merges": []}, "decoder": {"type": "ByteLevel"}, '
         b'"pre_tokenizer": {"type": "ByteLevel"}}', "lacks the field 'vocab'"),
        (b'{"model": {"type": "WordLevel", "vocab": {"a": 0}}}', "WordLevel is supported only over single characters"),
        (b'{"a": 0, "b": 1}', "a BPE vocabulary without its merges"),
    ],
)
def test_unreadable_or_unknown_tokenizer_files(tmp_path, content, message):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(TokenizerError, match=message) as caught:
        load(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_missing_paths_and_unknown_file_kinds(tmp_path):
    with pytest.raises(TokenizerError, match="no such tokenizer file or folder"):
        load(tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match="no tokenizer in this folder .looked for tokenizer.json, vocab.json"):
        load(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(TokenizerError, match="unknown tokenizer file; expected one of"):
        load(tmp_path / "weights.bin")
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(TokenizerError, match="not a WordPiece vocabulary .no \\[UNK\\] token"):
        load(tmp_path / "vocab.txt")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n")
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    with pytest.raises(TokenizerError, match=r"merges.txt:2: a merge line is two tokens"):
        load(tmp_path)


def test_bad_ids_to_decode(tokenizer):
    with pytest.raises(TokenizerError, match=r"token id 270 is out of range: this vocabulary has ids 0..269"):
        tokenizer.decode([1, 270])
    with pytest.raises(TokenizerError, match="token id -1 is out of range"):
        tokenizer.decode([-1])
    with pytest.raises(TokenizerError, match="token ids must be integers, got 1.5"):
        tokenizer.decode([1.5])
    with pytest.raises(TokenizerError, match="use decode_batch"):
        tokenizer.decode([[1, 2]])
    with pytest.raises(TokenizerError, match="decode takes token ids, got str"):
        tokenizer.decode("hello")


def test_bad_special_tokens_and_kinds(tokenizer, tmp_path: Path):
    with pytest.raises(TokenizerError, match="unknown special token role 'padding'; known: pad, bos"):
        tokenizer.add_special_tokens({"padding": "<pad>"})
    with pytest.raises(TokenizerError, match="special_tokens must be a list of str"):
        BPETokenizer.train("text", vocab_size=300, special_tokens="<pad>")
    with pytest.raises(TokenizerError, match="an added token must be a non-empty str"):
        tokenizer.add_tokens([""])
    with pytest.raises(TokenizerError, match="unknown tokenizer kind 'sentencepiece'; known: bpe, wordpiece, char"):
        train("sentencepiece", "text", 100)
    with pytest.raises(TokenizerError, match="WordPiece needs an unknown token"):
        WordPieceTokenizer.train("text", vocab_size=100, special_tokens=["[PAD]"])
    with pytest.raises(TokenizerError, match="folder .* does not exist"):
        tokenizer.save(tmp_path / "no" / "such" / "tokenizer.json")
