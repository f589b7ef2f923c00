"""Sequence-classification examples from TSV, CSV or JSONL: one text or a pair of texts, and a label.

Columns are found by name: in the header row of a TSV/CSV file (or the ``columns`` the caller gives for a
file without one) and in the keys of each JSONL object. By default the text is the first of ``sentence``,
``text``, ``sentence1``, ``text_a`` present, the second text of a pair the first of ``sentence2``,
``text_b`` present, and the label ``label``, so GLUE's ``sentence<TAB>label`` files read as they are.
Label names come from the data (sorted: numerically when all are integers) or from the caller, whose
order then fixes the label ids. TSV has no quoting (as GLUE's files); CSV follows RFC 4180 quoting.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.files import DataFileError, Skipped, read_data_text, sorted_names
from tformer.errors import listed, quoted

CLASSIFICATION_FORMATS = ("tsv", "csv", "jsonl")
TEXT_COLUMNS = ("sentence", "text", "sentence1", "text_a")
PAIR_COLUMNS = ("sentence2", "text_b")
LABEL_COLUMN = "label"


@dataclass(frozen=True)
class ClassificationExample:
    """One example: its text (and second text for a pair task), its label name (None when the file is
    read unlabelled) and the line it came from."""

    text: str
    text_pair: str | None
    label: str | None
    line: int


@dataclass
class ClassificationData:
    """The examples of one file, the label names (index = label id) and the bad rows left out."""

    path: str
    examples: list[ClassificationExample]
    label_names: tuple[str, ...]
    skipped: Skipped = field(default_factory=Skipped)

    def __len__(self) -> int:
        return len(self.examples)

    def label_ids(self) -> list[int]:
        """Each example's label as an index into ``label_names``."""
        index = {name: number for number, name in enumerate(self.label_names)}
        return [index[example.label] for example in self.examples]


def classification_format(path: str | Path) -> str:
    """tsv, csv or jsonl from the file's name (a .gz ending is looked through)."""
    name = Path(path).name.lower().removesuffix(".gz")
    for suffix, kind in ((".tsv", "tsv"), (".csv", "csv"), (".jsonl", "jsonl"), (".json", "jsonl")):
        if name.endswith(suffix):
            return kind
    raise DataFileError(f"{path}: cannot tell the format from the name; use one ending in .tsv, .csv or .jsonl "
                        "(or give format= one of tsv, csv, jsonl)")


def read_classification(
    path: str | Path,
    *,
    format: str | None = None,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str = LABEL_COLUMN,
    columns: Sequence[str] | None = None,
    labels: Sequence[str] | None = None,
    labeled: bool = True,
    skip_bad: bool = False,
    labels_from: str = "the declared labels",
) -> ClassificationData:
    """Read ``path`` (plain or .gz). ``columns`` names the columns of a TSV/CSV file without a header row
    (SST-2's sentence-level files: ``columns=["label", "sentence"]``). ``labels`` declares the label
    names (a label outside them is an error; ``labels_from`` says where they came from, e.g. the training
    file); ``labeled=False`` reads texts only (a test split).
    A bad row raises a DataFileError naming the file and line, or with ``skip_bad`` is left out and
    counted in ``skipped``."""
    kind = format or classification_format(path)
    if kind not in CLASSIFICATION_FORMATS:
        raise DataFileError(f"format={kind!r} is not one of {', '.join(CLASSIFICATION_FORMATS)}")
    if labels is not None:
        labels = tuple(str(name) for name in labels)
        if len(set(labels)) != len(labels) or not labels:
            raise DataFileError(f"labels={list(labels)} must be distinct names, at least one")
    text = read_data_text(path)
    known = {name for name in (text_column, text_pair_column, label_column) if name} | set(TEXT_COLUMNS)
    records = _json_records(text) if kind == "jsonl" else _table_records(path, text, kind, columns, known)
    skipped = Skipped()
    examples = []
    declared = set(labels) if labels is not None else None
    for line, record in records:
        if isinstance(record, str):
            skipped.handle(f"{path}:{line}: {record}", skip_bad)
            continue
        try:
            example = _example(record, line, text_column, text_pair_column, label_column if labeled else None)
        except DataFileError as error:
            skipped.handle(f"{path}:{line}: {error}", skip_bad)
            continue
        if declared is not None and example.label is not None and example.label not in declared:
            skipped.handle(f"{path}:{line}: label {quoted(example.label)} is not one of {labels_from}: "
                           f"{listed(labels)}", skip_bad)
            continue
        examples.append(example)
    if not examples:
        raise DataFileError(f"{path}: no examples" + (f" ({skipped.summary()})" if skipped else ""))
    if labels is None:
        labels = sorted_names(example.label for example in examples) if labeled else ()
    return ClassificationData(str(path), examples, labels, skipped)


def _example(record: dict, line: int, text_column: str | None, pair_column: str | None,
             label_column: str | None) -> ClassificationExample:
    """The example of one record (a dict of column -> value); a DataFileError without the file's name."""
    text_column = text_column or next((name for name in TEXT_COLUMNS if name in record), None)
    if text_column is None or text_column not in record:
        wanted = text_column or f"one of {', '.join(TEXT_COLUMNS)}"
        raise DataFileError(f"no text column ({wanted}) among {listed(record) or 'no columns'}")
    pair_column = pair_column or next((name for name in PAIR_COLUMNS if name in record), None)
    text = _text(record, text_column)
    pair = _text(record, pair_column) if pair_column is not None else None
    label = None
    if label_column is not None:
        value = record.get(label_column)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataFileError(f"the row has no label (column {label_column!r})")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise DataFileError(f"label {quoted(value)} is not a name or an integer")
        label = str(value).strip()
    return ClassificationExample(text, pair, label, line)


def _text(record: dict, column: str) -> str:
    value = record.get(column)
    if value is None:
        raise DataFileError(f"the row has no {column!r} column")
    if not isinstance(value, str):
        raise DataFileError(f"{column} {quoted(value)} is not a string")
    if not value.strip():
        raise DataFileError(f"{column} is empty")
    return value.strip()


def _table_records(path, text: str, kind: str, columns: Sequence[str] | None,
                   known: set[str]) -> Iterator[tuple[int, dict | str]]:
    """(line, {column: value}) for each non-blank row of a TSV/CSV text, or (line, what is wrong) for a
    row with more fields than the header; a row with fewer lacks the columns it does not reach. Without
    ``columns`` the first row is the header, and must name one of the ``known`` columns."""
    rows = _tsv_rows(text) if kind == "tsv" else _csv_rows(path, text)
    header = [name.strip() for name in columns] if columns is not None else None
    for line, fields in rows:
        if header is None:
            header = [name.strip() for name in fields]
            if not known & set(header):
                first = ", ".join(quoted(value) for value in fields[:4])
                raise DataFileError(f"{path}:{line}: the first row [{first}] is not a header naming the columns "
                                    f"(e.g. sentence, label); for a file without a header give columns=[...]")
            continue
        if len(fields) > len(header):
            yield line, f"{len(fields)} fields, but the header names {len(header)}: {listed(header)}"
            continue
        yield line, dict(zip(header, fields, strict=False))


def _tsv_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if line.strip():
            yield number, line.split("\t")


def _csv_rows(path, text: str) -> Iterator[tuple[int, list[str]]]:
    reader = csv.reader(text.splitlines(keepends=True))
    start = 1
    try:
        for fields in reader:
            if any(field.strip() for field in fields):
                yield start, fields
            start = reader.line_num + 1
    except csv.Error as error:
        raise DataFileError(f"{path}:{reader.line_num}: not valid CSV ({error})") from None


def _json_records(text: str) -> Iterator[tuple[int, dict | str]]:
    """(line, object) for each non-blank line, or (line, what is wrong) for one that is not an object."""
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            yield number, f"not a JSON object ({error.msg} at column {error.colno})"
            continue
        if not isinstance(record, dict):
            yield number, f"not a JSON object (a {type(record).__name__})"
            continue
        yield number, record
