"""Reading a labelled data file (TSV, CSV, JSONL, CoNLL, SQuAD JSON): its text, plain or gzip, and the one
error every reader raises for bad content, naming the file and the line (or the record).

A reader either fails on the first bad record or, where the caller asks (``skip_bad=True``), leaves it
out and keeps its message in a ``Skipped`` list the caller reports; either way nothing is half-read.
"""

from __future__ import annotations

import codecs
import gzip
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tformer.errors import TformerError


class DataFileError(TformerError):
    """A data file is missing, unreadable or malformed; the message names the file and the line
    (``path:line: ...``) or the record (``path: question ID: ...``)."""


def read_data_text(path: str | Path, encoding: str = "utf-8-sig") -> str:
    """The UTF-8 text of ``path``, gunzipped when its name ends in .gz (a leading byte-order mark
    dropped unless ``encoding`` is plain "utf-8")."""
    file = Path(path)
    if not file.is_file():
        raise DataFileError(f"{file}: no such file")
    try:
        raw = gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()
    except (OSError, EOFError) as error:
        raise DataFileError(f"{file}: cannot read ({error})") from None
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataFileError(f"{file}:{line}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not text.strip():
        raise DataFileError(f"{file}: the file is empty")
    return text


def data_lines(path: str | Path, encoding: str = "utf-8-sig") -> Iterator[tuple[int, str]]:
    """(line number, line with its "\\n" end) of ``path``, gunzipped when its name ends in .gz, read a
    line at a time so a file larger than memory streams. Lines split on "\\n" alone, as ``read_data_text``'s
    readers split them; a leading byte-order mark is dropped unless ``encoding`` is plain "utf-8". A file
    with no text but whitespace is a DataFileError, raised after its (blank) lines."""
    file = Path(path)
    if not file.is_file():
        raise DataFileError(f"{file}: no such file")
    offset, has_text = 0, False
    try:
        with gzip.open(file, "rb") if file.suffix == ".gz" else open(file, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                if number == 1 and encoding == "utf-8-sig" and raw.startswith(codecs.BOM_UTF8):
                    raw, offset = raw[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataFileError(f"{file}:{number}: not UTF-8 text ({error.reason} at byte "
                                        f"{offset + error.start})") from None
                offset += len(raw)
                has_text = has_text or bool(line.strip())
                yield number, line
    except (OSError, EOFError) as error:
        raise DataFileError(f"{file}: cannot read ({error})") from None
    if not has_text:
        raise DataFileError(f"{file}: the file is empty")


@dataclass
class Skipped:
    """The bad records a reader left out (``skip_bad=True``): their messages, in file order."""

    messages: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.messages)

    def handle(self, message: str, skip_bad: bool) -> None:
        """Keep ``message`` when skipping, else raise it."""
        if not skip_bad:
            raise DataFileError(message)
        self.messages.append(message)

    def summary(self) -> str:
        """One line for a log: how many were skipped and the first reason."""
        if not self.messages:
            return "no records skipped"
        return f"{len(self.messages)} bad records skipped (first: {self.messages[0]})"


def sorted_names(names) -> tuple[str, ...]:
    """Label names in a deterministic order: by number when every name is an integer ("2" before "10"),
    else alphabetically."""
    names = set(names)
    if names and all(_is_integer(name) for name in names):
        return tuple(sorted(names, key=int))
    return tuple(sorted(names))


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
