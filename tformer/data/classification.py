"""Sequence-classification examples from TSV, CSV, JSONL, Parquet or a datasets folder (``tformer.data.records``):
one text or a pair of texts, and a label.

Columns are found by name: in the header row of a TSV/CSV file (or the ``columns`` the caller gives for a
file without one) and in the keys of each JSONL object. By default the text is the first of ``sentence``,
``text``, ``sentence1``, ``text_a`` present, the second text of a pair the first of ``sentence2``,
``text_b`` present, and the label ``label``, so GLUE's ``sentence<TAB>label`` files read as they are.
Label names come from the data (sorted: numerically when all are integers) or from the caller, whose
order then fixes the label ids; a file's own ClassLabel names (Parquet and datasets folders Hugging Face
wrote) name its integer labels and, unless the caller declares names, are the label names in their order.
TSV has no quoting (as GLUE's files); CSV follows RFC 4180 quoting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.files import DataFileError, Skipped, sorted_names
from tformer.data.records import RECORD_FORMATS, RecordFile, class_name, field_value, record_format
from tformer.errors import listed, quoted

CLASSIFICATION_FORMATS = RECORD_FORMATS
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
    """tsv, csv, jsonl, parquet or datasets from the path (a .gz ending is looked through; a datasets folder
    by its state.json)."""
    kind = record_format(path)
    if kind is None:
        raise DataFileError(f"{path}: cannot tell the format from the name; use one ending in .tsv, .csv, .jsonl or "
                            f".parquet, or a datasets save_to_disk folder (or give format= one of "
                            f"{', '.join(CLASSIFICATION_FORMATS)})")
    return kind


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
    """Read ``path`` (TSV, CSV, JSONL, plain or .gz; Parquet; a datasets folder). ``columns`` names the
    columns of a TSV/CSV file without a header row (SST-2's sentence-level files: ``columns=["label",
    "sentence"]``). ``labels`` declares the label names (a label outside them is an error; ``labels_from``
    says where they came from, e.g. the training file); an integer label is a class id, named by the file's
    own ClassLabel names when it has them, else by ``labels``, else by its number. ``labeled=False`` reads
    texts only (a test split). A bad row raises a DataFileError naming the file and line, or with
    ``skip_bad`` is left out and counted in ``skipped``."""
    kind = format or classification_format(path)
    if kind not in CLASSIFICATION_FORMATS:
        raise DataFileError(f"format={kind!r} is not one of {', '.join(CLASSIFICATION_FORMATS)}")
    if labels is not None:
        labels = tuple(str(name) for name in labels)
        if len(set(labels)) != len(labels) or not labels:
            raise DataFileError(f"labels={list(labels)} must be distinct names, at least one")
    header_names = (text_column or TEXT_COLUMNS[0], label_column, *filter(None, [text_pair_column]), *TEXT_COLUMNS)
    records = RecordFile.open(path, kind, columns=columns, header_names=header_names)
    named = [(column, option) for column, option in ((text_column, "text_column"),
                                                      (text_pair_column, "text_pair_column"),
                                                      (label_column if labeled else None, "label_column"))
             if column is not None]
    for column, option in named:
        records.require(column, option)
    class_names = records.class_names(label_column) if labeled else None
    id_names = class_names or labels
    wanted = [*TEXT_COLUMNS, *PAIR_COLUMNS, *filter(None, [text_column, text_pair_column, label_column])]
    skipped = Skipped()
    examples = []
    declared = set(labels) if labels is not None else None
    for line, where, record in records.readable(wanted, skipped, skip_bad):
        try:
            if records.format == "jsonl":  # each record names its own columns: a named one must be there
                for column, option in named:
                    field_value(record, column, option, where)
            example = _example(record, line, text_column, text_pair_column, label_column if labeled else None,
                               id_names, labels or ())
        except DataFileError as error:
            message = str(error)
            skipped.handle(message if message.startswith(where) else f"{where}: {message}", skip_bad)
            continue
        if declared is not None and example.label is not None and example.label not in declared:
            skipped.handle(f"{where}: label {quoted(example.label)} is not one of {labels_from}: "
                           f"{listed(labels)}", skip_bad)
            continue
        examples.append(example)
    if not examples:
        raise DataFileError(f"{path}: no examples" + (f" ({skipped.summary()})" if skipped else ""))
    if labels is None:
        labels = (class_names or sorted_names(example.label for example in examples)) if labeled else ()
    return ClassificationData(str(path), examples, labels, skipped)


def _example(record: dict, line: int, text_column: str | None, pair_column: str | None,
             label_column: str | None, id_names: Sequence[str] | None = None,
             declared: Sequence[str] = ()) -> ClassificationExample:
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
        label = class_name(value, id_names, "label", declared)
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
