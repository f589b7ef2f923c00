"""Token files: a corpus as one flat array of token ids on disk (``data.bin``), memory-mappable
so training reads random windows without loading it, with a small JSON header beside it
(``data.bin.json``: dtype, count, vocabulary size, the tokenizer's fingerprint, the sources).

Ids are little-endian uint16 when the vocabulary fits (<= 65,536 ids), else uint32. Files are
written under a temporary name and renamed into place, so a crash leaves nothing half-written."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tformer.data.files import DataFileError
from tformer.data.records import record_format, record_lines
from tformer.errors import TformerError
from tformer.tokenizers.corpus import CHUNK_CHARS, cut_chunks, read_file_chunks

FORMAT = "tformer-token-file"
VERSION = 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


class TokenFileError(TformerError):
    """A token file or its header is missing, inconsistent, or from another tokenizer."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest dtype holding every id of a ``vocab_size`` vocabulary."""
    if vocab_size <= 1 << 16:
        return DTYPES["uint16"]
    if vocab_size <= 1 << 32:
        return DTYPES["uint32"]
    raise TokenFileError(f"vocab_size={vocab_size} does not fit a uint32 token file")


def header_path(path: str | os.PathLike) -> Path:
    """Where the header of token file ``path`` lives: beside it, with ".json" appended."""
    path = Path(path)
    return path.with_name(path.name + ".json")


class TokenFileWriter:
    """Write ids in pieces; ``close`` (or leaving the ``with`` block) publishes the file and its
    header together; an exception inside the block removes the partial file."""

    def __init__(self, path: str | os.PathLike, vocab_size: int, tokenizer_sha256: str | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise TokenFileError(f"cannot write {self.path}: folder {self.path.parent} does not exist")
        self.vocab_size = vocab_size
        self.dtype = token_dtype(vocab_size)
        self.tokenizer_sha256 = tokenizer_sha256
        self.metadata = dict(metadata or {})
        self.count = 0
        self._temporary = self.path.with_name(self.path.name + ".tmp")
        self._handle = open(self._temporary, "wb")  # closed by close() or abort()

    def write(self, ids: Sequence[int] | np.ndarray) -> None:
        """Append ids (each checked to lie in 0..vocab_size-1)."""
        array = np.asarray(ids, dtype=np.int64)
        if array.ndim != 1:
            raise TokenFileError(f"token ids must be a flat sequence, got shape {array.shape}")
        if array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            bad = array[(array < 0) | (array >= self.vocab_size)][0]
            raise TokenFileError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        array.astype(self.dtype).tofile(self._handle)
        self.count += int(array.size)

    def close(self) -> dict[str, Any]:
        """Publish the ids and the header; returns the header."""
        self._handle.close()
        header = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype.name,
            "byte_order": "little",
            "count": self.count,
            "vocab_size": self.vocab_size,
            "tokenizer_sha256": self.tokenizer_sha256,
            **self.metadata,
        }
        temporary_header = header_path(self._temporary)
        temporary_header.write_text(json.dumps(header, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(self._temporary, self.path)
        os.replace(temporary_header, header_path(self.path))
        return header

    def abort(self) -> None:
        """Drop everything written so far."""
        self._handle.close()
        self._temporary.unlink(missing_ok=True)

    def __enter__(self) -> TokenFileWriter:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def read_token_header(path: str | os.PathLike) -> dict[str, Any]:
    """The checked header of token file ``path``."""
    path = Path(path)
    header_file = header_path(path)
    if not path.is_file():
        raise TokenFileError(f"{path}: no such token file")
    if not header_file.is_file():
        raise TokenFileError(f"{path}: its header {header_file.name} is missing (write token files with "
                             "`tformer tokenize`)")
    try:
        header = json.loads(header_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenFileError(f"{header_file}: not a readable header ({error})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TokenFileError(f"{header_file}: not a {FORMAT} header")
    if header.get("version") != VERSION:
        raise TokenFileError(f"{header_file}: version {header.get('version')!r}; this tformer reads version {VERSION}")
    if header.get("dtype") not in DTYPES:
        raise TokenFileError(f"{header_file}: dtype {header.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    count = header.get("count")
    if not isinstance(count, int) or count < 0:
        raise TokenFileError(f"{header_file}: count {count!r} is not a non-negative integer")
    vocab_size = header.get("vocab_size")  # sizes the model's embedding: checked before anything is built
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 0 < vocab_size <= 1 << 32 \
            or token_dtype(vocab_size) != DTYPES[header["dtype"]]:
        raise TokenFileError(f"{header_file}: vocab_size {vocab_size!r} does not match dtype {header['dtype']} "
                             "(uint16: 1..65,536 ids, uint32: 65,537..4,294,967,296)")
    expected = count * DTYPES[header["dtype"]].itemsize
    if path.stat().st_size != expected:
        raise TokenFileError(f"{path}: {path.stat().st_size} bytes, but the header promises {count} "
                             f"{header['dtype']} ids ({expected} bytes); the file is truncated or not this header's")
    return header


def read_token_file(path: str | os.PathLike, tokenizer=None) -> np.ndarray:
    """The ids of token file ``path`` as a read-only ``np.memmap`` (an empty array when it holds
    none). With ``tokenizer`` (a tokenizer or its fingerprint), refuse a file made by another."""
    header = read_token_header(path)
    if tokenizer is not None:
        expected = tokenizer if isinstance(tokenizer, str) else tokenizer.fingerprint()
        if header.get("tokenizer_sha256") != expected:
            raise TokenFileError(f"{path}: made with another tokenizer (sha256 {header.get('tokenizer_sha256')}, "
                                 f"expected {expected}); re-run `tformer tokenize` with this tokenizer")
    dtype = DTYPES[header["dtype"]]
    if header["count"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(header["count"],))


def tokenize_files(tokenizer, files: Iterable[str | os.PathLike], out: str | os.PathLike,
                   separate_documents: bool = True, progress: bool = True,
                   chunk_chars: int | None = None, text_column: str = "text") -> dict[str, Any]:
    """Encode text files (plain or .gz) into token file ``out``, each file followed by the
    tokenizer's end-of-sequence token (or separator) when ``separate_documents`` and it has
    one. No special tokens are added inside a file. Files are read ``chunk_chars`` characters
    at a time (about 1M by default), cut where the ids cannot change. A records file (JSONL, CSV/TSV,
    Parquet, a datasets folder; ``tformer.data.records``) is the text of its ``text_column``, a record a
    line, streamed a record batch at a time, so a corpus larger than memory becomes a token file that
    training memory-maps. Returns the header."""
    files = [Path(file) for file in files]
    if not files:
        raise TokenFileError("no input files to tokenize")
    kinds = {}
    for file in files:
        try:
            kinds[file] = record_format(file)
        except DataFileError as error:
            raise TokenFileError(str(error)) from None
        if not file.is_file() and kinds[file] != "datasets":
            raise TokenFileError(f"{file}: no such file")
    separator = None
    if separate_documents:
        separator = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    started = time.perf_counter()
    total = None if any(file.suffix == ".gz" or kinds[file] for file in files) else \
        sum(file.stat().st_size for file in files)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing")
    text_bytes = 0
    metadata = {"sources": [str(file) for file in files], "separator_id": separator,
                "tokenizer": type(tokenizer).__name__}
    try:
        with TokenFileWriter(out, tokenizer.vocab_size, tokenizer.fingerprint(), metadata) as writer:
            for file in files:
                if kinds[file] is None:
                    chunks = read_file_chunks(file, chunk_chars or CHUNK_CHARS)
                else:
                    chunks = cut_chunks(record_lines(file, text_column), chunk_chars or CHUNK_CHARS)
                for chunk in _data_errors(chunks):
                    writer.write(tokenizer.encode(chunk, add_special_tokens=False))
                    size = len(chunk.encode("utf-8"))
                    text_bytes += size
                    if bar is not None:
                        bar.update(size)
                if separator is not None:
                    writer.write([separator])
            writer.metadata["text_bytes"] = text_bytes
            writer.metadata["seconds"] = round(time.perf_counter() - started, 3)
    finally:
        if bar is not None:
            bar.close()
    return read_token_header(out)


def _data_errors(chunks: Iterator[str]) -> Iterator[str]:
    """``chunks``, a records file's DataFileError raised as a TokenFileError (the message kept)."""
    try:
        yield from chunks
    except DataFileError as error:
        raise TokenFileError(str(error)) from None
