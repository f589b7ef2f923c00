"""Reading a training or tokenization corpus: in-memory texts and files (plain or .gz), in
chunks of about a megabyte cut where no word can straddle the cut, so encoding a file chunk
by chunk gives exactly the ids of encoding it whole; and counting its words for training."""

from __future__ import annotations

import gzip
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from tformer.tokenizers.added_tokens import AddedToken, AddedTokenSplitter
from tformer.tokenizers.errors import TokenizerError

CHUNK_CHARS = 1 << 20
TextsOrFiles = str | os.PathLike | Iterable[str | os.PathLike]


def iter_texts(texts_or_files: TextsOrFiles, chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """Yield the corpus as texts: a ``str`` is text, a ``Path`` (any ``os.PathLike``) is a file
    read in chunks; a list may mix both."""
    if isinstance(texts_or_files, (str, os.PathLike)):
        texts_or_files = [texts_or_files]
    for item in texts_or_files:
        if isinstance(item, os.PathLike):
            yield from read_file_chunks(item, chunk_chars)
        elif isinstance(item, str):
            yield item
        else:
            raise TokenizerError(f"a corpus item must be a str (text) or a Path (file), got {type(item).__name__}")


def open_text(path: str | os.PathLike):
    """A text file (``.gz`` decompressed) opened as UTF-8, with a clear error when it cannot be."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        return opener(path, "rt", encoding="utf-8", newline="")
    except OSError as error:
        raise TokenizerError(f"{path}: cannot be read ({error.strerror or error})") from None


def read_file_chunks(path: str | os.PathLike, chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """The text of ``path`` in pieces of about ``chunk_chars`` characters whose concatenation
    is the file (see ``cut_chunks``)."""
    with open_text(path) as handle:
        try:
            yield from cut_chunks(iter(lambda: handle.read(chunk_chars), ""), chunk_chars)
        except UnicodeDecodeError as error:
            raise TokenizerError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start} of a block)") from None


def cut_chunks(pieces: Iterable[str], chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """The concatenated ``pieces`` (a file's blocks, a records file's lines) in chunks of about
    ``chunk_chars`` characters, read a piece at a time. Each cut falls just before a space that follows a
    non-whitespace character: no pre-tokenizer here (GPT-2's or GPT-4's pattern, BERT's, characters) lets
    a word cross that point, and none looks back, so the words (and ids) are those of the whole text."""
    pending = ""
    for piece in pieces:
        pending += piece
        if len(pending) >= chunk_chars:
            cut = _safe_cut(pending)
            if cut > 0:
                yield pending[:cut]
                pending = pending[cut:]
    if pending:
        yield pending


def _safe_cut(text: str) -> int:
    """The last index ``i`` with ``text[i]`` a space and ``text[i-1]`` not whitespace, or 0."""
    index = text.rfind(" ")
    while index > 0:
        if not text[index - 1].isspace():
            return index
        index = text.rfind(" ", 0, index)
    return 0


def count_words(texts_or_files: TextsOrFiles, split: Callable[[str], list[str]], specials: Sequence[str],
                normalize: Callable[[str], str] | None = None) -> Counter:
    """How often each word (``split`` of the ``normalize``d text) occurs in the corpus; special
    tokens found in the text are left out, so training never learns pieces of them."""
    splitter = AddedTokenSplitter({index: AddedToken(token) for index, token in enumerate(specials)}, str)
    counts: Counter = Counter()
    any_text = False
    for text in iter_texts(texts_or_files):
        any_text = any_text or bool(text)
        for piece, token_id in splitter.split(text):
            if token_id is None:
                counts.update(split(piece if normalize is None else normalize(piece)))
    if not counts:
        raise TokenizerError("empty corpus: the training texts hold no words" if any_text
                             else "empty corpus: no text to train on")
    return counts


def training_progress(enabled: bool, total: int, unit: str):
    """A tqdm bar on stderr for a training loop, or None when disabled."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=max(total, 0), unit=f" {unit}", desc="training", leave=False)
