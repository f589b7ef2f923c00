"""Token files: written atomically with a header, read back as a memmap, checked against the
tokenizer; encoding a file in chunks gives exactly the ids of encoding it whole."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from shared_data import GPT2_DIR, require, tinyshakespeare, unicode_sample

from tformer.data import (
    TokenFileError,
    TokenFileWriter,
    read_token_file,
    read_token_header,
    token_dtype,
    tokenize_files,
)
from tformer.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer, load
from tformer.tokenizers.corpus import read_file_chunks

CORPUS = "It was the best of times, it was the worst of times.\n  Indented line\twith tab\n\n" * 40


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=320)


def test_dtype_fits_the_vocabulary():
    assert token_dtype(50257) == np.dtype("<u2") and token_dtype(65536) == np.dtype("<u2")
    assert token_dtype(65537) == np.dtype("<u4")


def test_write_and_read_round_trip(tmp_path):
    with TokenFileWriter(tmp_path / "data.bin", vocab_size=70000, tokenizer_sha256="abc") as writer:
        writer.write([1, 2, 69999])
        writer.write(np.array([5, 6]))
    ids = read_token_file(tmp_path / "data.bin")
    assert isinstance(ids, np.memmap) and ids.dtype == np.dtype("<u4") and ids.tolist() == [1, 2, 69999, 5, 6]
    header = read_token_header(tmp_path / "data.bin")
    assert header["count"] == 5 and header["dtype"] == "uint32" and header["tokenizer_sha256"] == "abc"
    assert (tmp_path / "data.bin").stat().st_size == 20


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(TokenFileError, match="token id 300 is outside the vocabulary .0..299."):
        with TokenFileWriter(tmp_path / "data.bin", vocab_size=300) as writer:
            writer.write([1, 2])
            writer.write([300])
    assert list(tmp_path.iterdir()) == []


def test_reader_checks_the_header(tmp_path, bpe):
    (tmp_path / "text.txt").write_text(CORPUS)
    tokenize_files(bpe, [tmp_path / "text.txt"], tmp_path / "data.bin", progress=False)
    assert len(read_token_file(tmp_path / "data.bin", tokenizer=bpe)) > 0
    other = BPETokenizer.train(CORPUS, vocab_size=280)
    with pytest.raises(TokenFileError, match="made with another tokenizer"):
        read_token_file(tmp_path / "data.bin", tokenizer=other)
    with open(tmp_path / "data.bin", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(TokenFileError, match="the header promises"):
        read_token_file(tmp_path / "data.bin")
    header = json.loads((tmp_path / "data.bin.json").read_text())
    for vocab_size in (10**12, 10**6, 0, "300"):  # one bad value must not size a model's embedding
        (tmp_path / "data.bin.json").write_text(json.dumps({**header, "vocab_size": vocab_size}))
        with pytest.raises(TokenFileError, match=rf"data.bin.json: vocab_size {vocab_size!r} does not match dtype "
                                                 r"uint16 \(uint16: 1..65,536 ids"):
            read_token_file(tmp_path / "data.bin")
    (tmp_path / "data.bin.json").unlink()
    with pytest.raises(TokenFileError, match="its header data.bin.json is missing"):
        read_token_file(tmp_path / "data.bin")
    with pytest.raises(TokenFileError, match="no such token file"):
        read_token_file(tmp_path / "missing.bin")


@pytest.mark.parametrize("chunk_chars", [7, 50, 1 << 20])
def test_chunks_concatenate_to_the_file(tmp_path, chunk_chars):
    text = CORPUS + unicode_sample()
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    chunks = list(read_file_chunks(tmp_path / "text.txt", chunk_chars))
    assert "".join(chunks) == text
    assert all(chunk[0] == " " for chunk in chunks[1:])


def test_tokenized_file_equals_encoding_the_whole_text(tmp_path, bpe):
    text = CORPUS + unicode_sample()
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("second document")
    header = tokenize_files(bpe, [tmp_path / "a.txt", tmp_path / "b.txt.gz"], tmp_path / "data.bin", progress=False,
                            chunk_chars=64)
    eos = bpe.eos_token_id
    expected = bpe.encode(text) + [eos] + bpe.encode("second document") + [eos]
    assert read_token_file(tmp_path / "data.bin").tolist() == expected
    assert header["count"] == len(expected) and header["separator_id"] == eos
    assert header["text_bytes"] == len(text.encode("utf-8")) + len("second document")


GPT4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.mark.parametrize("make", [
    lambda: WordPieceTokenizer.train(CORPUS, vocab_size=120),
    lambda: CharTokenizer.train(CORPUS + unicode_sample()),
    lambda: BPETokenizer.train(CORPUS, vocab_size=300, pattern=GPT4_PATTERN),
])
def test_chunked_encoding_is_exact_for_other_tokenizers(tmp_path, make):
    tokenizer = make()
    text = CORPUS + unicode_sample()
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    tokenize_files(tokenizer, [tmp_path / "a.txt"], tmp_path / "data.bin", separate_documents=False, progress=False,
                   chunk_chars=50)
    assert read_token_file(tmp_path / "data.bin").tolist() == tokenizer.encode(text, add_special_tokens=False)


def test_gpt2_tinyshakespeare_token_file(tmp_path):
    require(GPT2_DIR / "encoder.json")
    gpt2 = load(GPT2_DIR)
    (tmp_path / "input.txt").write_text(tinyshakespeare(), encoding="utf-8")
    header = tokenize_files(gpt2, [tmp_path / "input.txt"], tmp_path / "data.bin", separate_documents=False,
                            progress=False)
    ids = read_token_file(tmp_path / "data.bin", tokenizer=gpt2)
    assert header["dtype"] == "uint16" and header["count"] == 338025 == len(ids)
    assert gpt2.decode(ids[:1000]) == tinyshakespeare()[:len(gpt2.decode(ids[:1000]))]
