"""Records: the rows of a data file as dicts of column -> value, one format layer under every task's reader.

* **jsonl** (``.jsonl``, ``.json``; ``.gz`` too): one JSON object a line, read a line at a time.
* **tsv** / **csv** (``.tsv``, ``.csv``; ``.gz`` too): a header row naming the columns (or ``columns`` given
  for a file without one), read a line at a time; TSV splits on tabs with no quoting (as GLUE's files),
  CSV follows RFC 4180 quoting. Every value is a string.
* **parquet** (``.parquet``): read a record batch at a time with pyarrow, only the columns asked for.
* **datasets**: a folder written by Hugging Face ``datasets``' ``save_to_disk`` (``state.json`` listing its
  ``data-*.arrow`` files, Arrow IPC streams, and ``dataset_info.json``), read a record batch at a time with
  pyarrow; the ``datasets`` package is not needed. A ``DatasetDict`` folder is refused naming its splits.

Parquet and datasets folders keep their value types (lists, dicts, integers) and, when Hugging Face wrote
them, the class names of their ``ClassLabel`` columns (``class_names``), which map integer labels to names.
pyarrow is an optional dependency: ``pip install 'tformer[data]'``.

A record is ``(position, fields)``: the line of a text file, the row (from 1) of a table; ``where(position)``
names it in a message. A line that is no record (bad JSON, more fields than the header) comes as
``(position, what is wrong)`` for the reader to raise or skip.

The same rules in every format: a column is named once (a TSV/CSV header, ``columns``, a table's schema, a
JSON object's keys: a second ``text`` would silently replace the first); a JSONL, TSV or CSV line, and a CSV
value spanning lines, holds at most ``MAX_RECORD_CHARS`` characters (64 Mi; a longer one is a bad record
naming its line, where the csv module stopped at 128 Ki with its own words); a class label that is NaN or -1
(Hugging Face's "no label") is refused (``class_name``).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.files import DataFileError, Skipped, data_lines
from tformer.errors import listed, quoted

RECORD_FORMATS = ("jsonl", "csv", "tsv", "parquet", "datasets")
TEXT_RECORD_FORMATS = ("jsonl", "csv", "tsv")
_SUFFIXES = ((".jsonl", "jsonl"), (".json", "jsonl"), (".csv", "csv"), (".tsv", "tsv"))
BATCH_ROWS = 1024  # rows of a Parquet / Arrow record batch read at a time
PYARROW_HINT = "pip install 'tformer[data]'"
MAX_RECORD_CHARS = 64 * 1024 * 1024  # one JSONL/TSV/CSV line or CSV value: a document, not a whole corpus
NO_LABEL = -1  # Hugging Face's "no label": ClassLabel's missing value, on every row of GLUE's test splits


def record_format(path: str | Path) -> str | None:
    """The record format of ``path`` by its name (a .gz ending looked through) or, for a folder, by the
    ``state.json`` that ``save_to_disk`` writes; None when it is none of them."""
    path = Path(path)
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = sorted(entry.name for entry in path.iterdir() if (entry / "state.json").is_file())
            raise DataFileError(f"{path}: a DatasetDict folder holding splits {', '.join(splits) or '(none)'}; "
                                f"name one split's folder (e.g. {path / (splits[0] if splits else 'train')})")
        return "datasets" if (path / "state.json").is_file() else None
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    name = name.removesuffix(".gz")
    return next((kind for suffix, kind in _SUFFIXES if name.endswith(suffix)), None)


def pyarrow_modules():
    """(pyarrow, pyarrow.parquet), or a DataFileError saying how to install them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise DataFileError(f"reading Parquet files and datasets folders needs pyarrow: {PYARROW_HINT}") from None
    return pyarrow, pyarrow.parquet


@dataclass
class RecordFile:
    """A data file (or datasets folder) read as records. ``columns``: the column names of a TSV/CSV file
    without a header row; ``header_names``: names of which a TSV/CSV header row must hold one (a first row
    holding none is data, refused rather than read as a header; the first two are the message's example);
    ``format``: one of RECORD_FORMATS (default: by the name)."""

    path: Path
    format: str
    columns: tuple[str, ...] | None = None
    header_names: tuple[str, ...] = ()
    _schema_names: list[str] | None = field(default=None, repr=False)
    _class_names: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: str | Path, format: str | None = None, *, columns: Sequence[str] | None = None,
             header_names: Iterable[str] = ()) -> RecordFile:
        """The file's records, checked now: the format, its columns' names (tables) and, with pyarrow, that
        it can be read at all."""
        path = Path(path)
        kind = format or record_format(path)
        if kind is None:
            raise DataFileError(f"{path}: cannot tell the format from the name; use one ending in .jsonl, .csv, "
                                ".tsv or .parquet, or a datasets save_to_disk folder")
        if kind not in RECORD_FORMATS:
            raise DataFileError(f"format={kind!r} is not one of {', '.join(RECORD_FORMATS)}")
        if columns is not None and kind not in ("tsv", "csv"):
            raise DataFileError(f"{path}: columns=[...] names the columns of a TSV/CSV file without a header row, "
                                f"not of a {kind} file (its columns are named in it)")
        if kind == "datasets" and not path.is_dir():
            raise DataFileError(f"{path}: no such folder (a datasets folder is what save_to_disk writes)")
        if kind != "datasets" and not path.is_file():
            raise DataFileError(f"{path}: no such file")
        names = None if columns is None else tuple(name.strip() for name in columns)
        if names is not None and (twice := repeated(names)):
            raise DataFileError(f"{path}: columns=[...] names {twice!r} twice; each column needs its own name")
        records = cls(path, kind, names, tuple(dict.fromkeys(header_names)))
        if kind == "parquet":
            records._read_parquet_schema()
        elif kind == "datasets":
            records._read_datasets_schema()
        return records

    # ---- what the file holds ------------------------------------------------------------------------

    def column_names(self) -> list[str] | None:
        """The columns every record has (a table's header or schema); None for JSON Lines, whose records
        each name their own."""
        if self.format in ("parquet", "datasets"):
            return list(self._schema_names)
        if self.format == "jsonl":
            return None
        if self.columns is not None:
            return list(self.columns)
        rows = self._rows()
        try:
            for line, fields in rows:
                return self._header(fields, line)
        finally:
            rows.close()
        return []

    def class_names(self, column: str) -> tuple[str, ...] | None:
        """The class names a Hugging Face ``ClassLabel`` column (or list of them) declares, by id; None when
        the file declares none."""
        return self._class_names.get(column)

    def require(self, column: str, option: str) -> None:
        """A DataFileError, one line naming the file, the column and the columns present, when a table lacks
        ``column`` (``option``: the setting that names it); JSON Lines are checked record by record."""
        present = self.column_names()
        if present is not None and column not in present:
            raise DataFileError(missing_column(str(self.path), column, option, present))

    def where(self, position: int) -> str:
        """A record's place in a message: ``path:line`` for a text file, ``path: row N`` for a table."""
        return f"{self.path}:{position}" if self.format in TEXT_RECORD_FORMATS else f"{self.path}: row {position}"

    # ---- reading --------------------------------------------------------------------------------------

    def records(self, wanted: Sequence[str] | None = None) -> Iterator[tuple[int, dict | str]]:
        """(position, {column: value}) for each record, in order, streamed; (position, what is wrong) for a
        line that is none. ``wanted``: the columns to read (Parquet and datasets folders read no others)."""
        if self.format == "jsonl":
            yield from self._json_records()
        elif self.format in ("tsv", "csv"):
            yield from self._table_records()
        else:
            yield from self._arrow_records(wanted)

    def readable(self, wanted: Sequence[str] | None = None, skipped: Skipped | None = None,
                 skip_bad: bool = False) -> Iterator[tuple[int, str, dict]]:
        """(position, where, record) for each record that is one (``where``: its place for a message); a
        line that is none raises a DataFileError naming it, or with ``skip_bad`` is left out in ``skipped``."""
        for position, record in self.records(wanted):
            where = self.where(position)
            if isinstance(record, str):
                (skipped or Skipped()).handle(f"{where}: {record}", skip_bad)
                continue
            yield position, where, record

    def _json_records(self) -> Iterator[tuple[int, dict | str]]:
        for number, line in data_lines(self.path):
            line = line.removesuffix("\n")
            if not line.strip():
                continue
            if len(line) > MAX_RECORD_CHARS:
                yield number, _too_long(len(line))
                continue
            try:
                record = json.loads(line, object_pairs_hook=_object)
            except json.JSONDecodeError as error:
                yield number, f"not a JSON object ({error.msg} at column {error.colno})"
                continue
            except _RepeatedKey as error:
                yield number, f"the object names {error.args[0]!r} twice; each key needs its own name"
                continue
            if not isinstance(record, dict):
                yield number, f"not a JSON object (a {type(record).__name__})"
                continue
            yield number, record

    def _rows(self) -> Iterator[tuple[int, list[str]]]:
        """(line, fields) of each non-blank row of a TSV/CSV file."""
        if self.format == "tsv":
            for number, line in data_lines(self.path):
                line = line.removesuffix("\n").removesuffix("\r")
                if len(line) > MAX_RECORD_CHARS:
                    raise DataFileError(f"{self.path}:{number}: {_too_long(len(line))}")
                if line.strip():
                    yield number, line.split("\t")
            return
        lines = data_lines(self.path)
        reader = csv.reader(_bounded_lines(lines, self.path))
        if csv.field_size_limit() < MAX_RECORD_CHARS:  # the module's 128 Ki default, process-wide: raised once
            csv.field_size_limit(MAX_RECORD_CHARS)
        start = 1
        try:
            for fields in reader:
                if any(value.strip() for value in fields):
                    yield start, fields
                start = reader.line_num + 1
        except csv.Error as error:
            if "field larger than field limit" in str(error):  # named by the line its record starts on
                raise DataFileError(f"{self.path}:{start}: {_too_long(None)}") from None
            raise DataFileError(f"{self.path}:{reader.line_num}: not valid CSV ({error})") from None

    def _header(self, fields: list[str], line: int) -> list[str]:
        header = [name.strip() for name in fields]
        if self.header_names and not set(self.header_names) & set(header):
            first = ", ".join(quoted(value) for value in fields[:4])
            raise DataFileError(f"{self.path}:{line}: the first row [{first}] is not a header naming the "
                                f"columns (e.g. {', '.join(self.header_names[:2])}); for a file without a header "
                                "give columns=[...]")
        if twice := repeated(name for name in header if name):
            raise DataFileError(f"{self.path}:{line}: the header names column {twice!r} twice; each column needs "
                                "its own name")
        return header

    def _table_records(self) -> Iterator[tuple[int, dict | str]]:
        header = list(self.columns) if self.columns is not None else None
        for line, fields in self._rows():
            if header is None:
                header = self._header(fields, line)
                continue
            if len(fields) > len(header):
                yield line, f"{len(fields)} fields, but the header names {len(header)}: {listed(header)}"
                continue
            yield line, dict(zip(header, fields, strict=False))

    def _arrow_records(self, wanted: Sequence[str] | None) -> Iterator[tuple[int, dict]]:
        names = [name for name in self._schema_names if wanted is None or name in wanted]
        position = 0
        for batch in self._batches(names):
            for record in batch.to_pylist():
                position += 1
                yield position, record

    def _batches(self, names: list[str]):
        pyarrow, parquet = pyarrow_modules()
        try:
            if self.format == "parquet":
                yield from parquet.ParquetFile(self.path).iter_batches(batch_size=BATCH_ROWS, columns=names)
                return
            for file in self._arrow_files():
                with pyarrow.memory_map(str(file)) as source:
                    for batch in pyarrow.ipc.open_stream(source):
                        for start in range(0, batch.num_rows, BATCH_ROWS):
                            yield batch.slice(start, BATCH_ROWS).select(names)
        except (pyarrow.ArrowException, OSError) as error:
            raise DataFileError(f"{self.path}: cannot read ({error})") from None

    # ---- pyarrow schemas -----------------------------------------------------------------------------

    def _read_parquet_schema(self) -> None:
        pyarrow, parquet = pyarrow_modules()
        try:
            schema = parquet.read_schema(self.path)
        except (pyarrow.ArrowException, OSError) as error:
            raise DataFileError(f"{self.path}: not a readable Parquet file ({error})") from None
        self._set_schema_names(schema.names)
        metadata = (schema.metadata or {}).get(b"huggingface")
        if metadata:
            try:
                features = json.loads(metadata).get("info", {}).get("features", {})
            except (json.JSONDecodeError, AttributeError):
                features = {}
            self._class_names = hub_class_names(features)

    def _set_schema_names(self, names: Sequence[str]) -> None:
        if twice := repeated(names):
            raise DataFileError(f"{self.path}: the schema names column {twice!r} twice; each column needs its own "
                                "name")
        self._schema_names = list(names)

    def _arrow_files(self) -> list[Path]:
        try:
            state = json.loads((self.path / "state.json").read_text(encoding="utf-8"))
            files = [self.path / entry["filename"] for entry in state["_data_files"]]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise DataFileError(f"{self.path}: state.json does not list the data files (\"_data_files\": "
                                f"[{{\"filename\": ...}}]) ({error})") from None
        if not files:
            raise DataFileError(f"{self.path}: state.json lists no data files")
        for file in files:
            if not file.is_file():
                raise DataFileError(f"{self.path}: state.json lists {file.name}, which is not in the folder")
        return files

    def _read_datasets_schema(self) -> None:
        pyarrow, _ = pyarrow_modules()
        first = self._arrow_files()[0]
        try:
            with pyarrow.memory_map(str(first)) as source:
                schema = pyarrow.ipc.open_stream(source).schema
        except (pyarrow.ArrowException, OSError) as error:
            raise DataFileError(f"{first}: not a readable Arrow stream ({error})") from None
        self._set_schema_names(schema.names)
        info = self.path / "dataset_info.json"
        features = {}
        if info.is_file():
            try:
                features = json.loads(info.read_text(encoding="utf-8")).get("features") or {}
            except (OSError, json.JSONDecodeError, AttributeError) as error:
                raise DataFileError(f"{info}: not readable JSON ({error})") from None
        self._class_names = hub_class_names(features)


def hub_class_names(features: dict) -> dict[str, tuple[str, ...]]:
    """Column -> class names, for the ``ClassLabel`` columns (and lists of them) of a Hugging Face
    ``features`` description."""
    found = {}
    for column, feature in (features.items() if isinstance(features, dict) else ()):
        while isinstance(feature, dict) and feature.get("_type") in ("Sequence", "List", "LargeList"):
            feature = feature.get("feature")
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and feature.get("names"):
            found[column] = tuple(str(name) for name in feature["names"])
    return found


def missing_column(where: str, column: str, option: str, present: Iterable[str]) -> str:
    """The message for a record without ``column``: the file, the column and the setting asked for, the
    columns there are."""
    present = list(present)
    return f"{where}: no column {column!r} ({option}); the columns are: {listed(present) or 'none'}"


def field_value(record: dict, column: str, option: str, where: str):
    """``record[column]``, or a DataFileError naming the column, its setting and the record's columns."""
    if column not in record:
        raise DataFileError(missing_column(where, column, option, record))
    return record[column]


def class_name(value, names: Sequence[str] | None, what: str, declared: Sequence[str] = ()) -> str:
    """A label value as a name: an integer is a class id, named by ``names`` (an id outside them is refused)
    or, without names, its number; a string is stripped. A DataFileError for anything else, and, in every
    format, for NaN (a float, or a cell spelling it: a missing value) and -1 (Hugging Face's "no label"; as
    text it is a class only where ``declared`` names "-1")."""
    text = value.strip() if isinstance(value, str) else None
    if (isinstance(value, float) and math.isnan(value)) or (text is not None and text.lower() == "nan"):
        raise DataFileError(f"{what} {quoted(value)} is a missing value (NaN), not a class name")
    if (type(value) is int and value == NO_LABEL) or (text == str(NO_LABEL) and text not in declared):
        raise DataFileError(f"{what} -1 is Hugging Face's \"no label\" (the rows of an unlabelled split), not a "
                            "class; give labelled rows, or declare \"-1\" among the label names if it is a class")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFileError(f"{what} {quoted(value)} is not a name or an integer")
    if isinstance(value, str):
        return value.strip()
    if names is None:
        return str(value)
    if not 0 <= value < len(names):
        raise DataFileError(f"{what} {value} is not a class id of the {len(names)} names (0..{len(names) - 1}: "
                            f"{listed(names)})")
    return names[value]


def repeated(names: Iterable[str]) -> str | None:
    """The first name that comes twice in ``names``, or None."""
    seen = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


class _RepeatedKey(Exception):
    """A JSON object naming a key twice (``json`` would keep the last value silently)."""


def _object(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``'s object_pairs_hook: the object as a dict, its keys each named once."""
    record = dict(pairs)
    if len(record) != len(pairs):
        raise _RepeatedKey(repeated(key for key, _ in pairs))
    return record


def _too_long(characters: int | None) -> str:
    """The message for a line (or a CSV value) past ``MAX_RECORD_CHARS``."""
    size = f"{characters:,} characters" if characters is not None else "a value"
    return (f"{size} past the limit of one record ({MAX_RECORD_CHARS:,} characters: a JSONL, TSV or CSV line, "
            "or a CSV value)")


def _bounded_lines(lines: Iterator[tuple[int, str]], path: Path) -> Iterator[str]:
    """The lines of a CSV file for ``csv.reader``, each checked against ``MAX_RECORD_CHARS`` before it is parsed."""
    for number, line in lines:
        if len(line) > MAX_RECORD_CHARS:
            raise DataFileError(f"{path}:{number}: {_too_long(len(line))}")
        yield line


def list_value(value, where: str, what: str) -> list:
    """A list column's value: a list as it is, or a TSV/CSV cell's whitespace-separated items."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, (list, tuple)):
        return list(value)
    raise DataFileError(f"{where}: {what} must be a list (or, in a TSV/CSV cell, items separated by spaces), "
                        f"not {type(value).__name__}")


def json_cell(value, where: str, what: str):
    """A structured column's value: as it is from JSON Lines, Parquet or Arrow; parsed from a TSV/CSV cell,
    which holds it as JSON."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise DataFileError(f"{where}: {what} in a TSV/CSV cell must be JSON ({error.msg} at column {error.colno})") \
            from None


def record_lines(path: str | Path, column: str = "text", *, format: str | None = None,
                 columns: Sequence[str] | None = None, option: str = "text_column") -> Iterator[str]:
    """Each record's ``column`` as a line of text (a newline added unless it ends in one), streamed: the
    text file the records stand for, for the tasks that read plain text (language modelling, masked LM) and
    for ``tformer tokenize``."""
    records = RecordFile.open(path, format, columns=columns)
    records.require(column, option)
    for _, where, record in records.readable([column]):
        text = field_value(record, column, option, where)
        if not isinstance(text, str):
            raise DataFileError(f"{where}: {column} {quoted(text)} is not a string")
        yield text if text.endswith("\n") else text + "\n"
