"""Parallel text for translation: two files of one sentence a line, line i of one the translation of
line i of the other. A corpus is named by its prefix and two language codes (``train`` + ``de``/``en``:
``train.de`` and ``train.en``, or ``train.de.gz`` and ``train.en.gz``), as fairseq and Moses name them.

Files of different line counts are refused naming both counts; pairs with an empty side are left out and
counted. ``read_parallel_records`` reads the pairs from records (a ``translation`` column of
``{language: sentence}``, or a source and a target column) of a JSONL, TSV/CSV, Parquet file or a datasets
folder. Lines are split on "\\n" only (a Unicode line separator inside a sentence is not a new line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tformer.data.files import DataFileError, read_data_text
from tformer.data.records import RecordFile, field_value, json_cell

TRANSLATION_COLUMN = "translation"  # Hugging Face's wmt / opus datasets: {"de": ..., "en": ...} a pair


@dataclass
class ParallelText:
    """Aligned ``sources`` and ``targets`` (as many of each) and how many pairs were left out as empty."""

    sources: list[str]
    targets: list[str]
    source_path: str
    target_path: str
    empty_skipped: int = 0

    def __len__(self) -> int:
        return len(self.sources)

    def describe(self) -> str:
        skipped = f" ({self.empty_skipped:,} with an empty side skipped)" if self.empty_skipped else ""
        names = Path(self.source_path).name
        if self.target_path != self.source_path:  # two files, not one file of records
            names += f" + {Path(self.target_path).name}"
        return f"{names}: {len(self):,} pairs{skipped}"


def text_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (.gz read too), split on "\\n" alone, without their "\\r"."""
    text = read_data_text(path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


def read_aligned(first: str | Path, second: str | Path, *, what: str = "line") -> tuple[list[str], list[str]]:
    """The lines of two files that must align line for line; a mismatch names both files and counts."""
    first_lines, second_lines = text_lines(first), text_lines(second)
    if len(first_lines) != len(second_lines):
        raise DataFileError(f"{first} has {len(first_lines):,} lines but {second} has {len(second_lines):,}; "
                            f"they must align, one {what} a line")
    return first_lines, second_lines


def corpus_file(prefix: str | Path, language: str) -> Path:
    """``PREFIX.LANG``, else ``PREFIX.LANG.gz``: the file of one side of a corpus."""
    plain = Path(f"{prefix}.{language}")
    if plain.is_file():
        return plain
    packed = Path(f"{plain}.gz")
    if packed.is_file():
        return packed
    raise DataFileError(f"{plain}: no such file (nor {packed.name}); a corpus is named by its prefix, its files "
                        f"PREFIX.{language} or PREFIX.{language}.gz")


def read_parallel(prefix: str | Path, source_language: str, target_language: str) -> ParallelText:
    """The sentence pairs of corpus ``prefix`` from ``source_language`` into ``target_language``."""
    source_path = corpus_file(prefix, source_language)
    target_path = corpus_file(prefix, target_language)
    sources, targets = read_aligned(source_path, target_path, what="sentence")
    return _kept_pairs(sources, targets, str(source_path), str(target_path))


def _kept_pairs(sources, targets, source_path: str, target_path: str) -> ParallelText:
    """The pairs with both sides non-empty (stripped), the others counted."""
    kept_sources, kept_targets = [], []
    for source, target in zip(sources, targets, strict=True):
        source, target = source.strip(), target.strip()
        if source and target:
            kept_sources.append(source)
            kept_targets.append(target)
    if not kept_sources:
        where = source_path if source_path == target_path else f"{source_path} and {target_path}"
        raise DataFileError(f"{where} hold no pair of non-empty lines")
    return ParallelText(kept_sources, kept_targets, source_path, target_path, len(sources) - len(kept_sources))


def read_parallel_records(path: str | Path, source_language: str | None = None, target_language: str | None = None,
                          *, format: str | None = None, translation_column: str = TRANSLATION_COLUMN,
                          source_column: str | None = None, target_column: str | None = None,
                          columns: Sequence[str] | None = None) -> ParallelText:
    """Sentence pairs from records (JSONL, TSV/CSV, Parquet, a datasets folder; ``tformer.data.records``):
    a ``translation`` column of ``{language: sentence}`` objects (Hugging Face's wmt and opus datasets; in a
    TSV/CSV cell as JSON) read from ``source_language`` into ``target_language``, or two columns of
    sentences, ``source_column`` and ``target_column`` (given together). Pairs with an empty side are left
    out and counted, as ``read_parallel`` does."""
    if (source_column is None) != (target_column is None):
        raise DataFileError("source_column and target_column are given together (or neither: the "
                            f"{translation_column!r} column's languages)")
    two_columns = source_column is not None
    if not two_columns and not (source_language and target_language):
        raise DataFileError(f"{path}: the {translation_column!r} column is read by language: give the source and "
                            "target languages (or source_column and target_column)")
    records = RecordFile.open(path, format, columns=columns)
    wanted = [source_column, target_column] if two_columns else [translation_column]
    options = ["source_column", "target_column"] if two_columns else ["translation_column"]
    for column, option in zip(wanted, options, strict=True):
        records.require(column, option)
    sources, targets = [], []
    for _, where, record in records.readable(wanted):
        if two_columns:
            pair = [field_value(record, column, option, where) for column, option in zip(wanted, options, strict=True)]
            names = wanted
        else:
            sentences = json_cell(field_value(record, translation_column, "translation_column", where), where,
                                  translation_column)
            if not isinstance(sentences, dict):
                raise DataFileError(f"{where}: {translation_column} must map languages to sentences, e.g. "
                                    f"{{\"{source_language}\": ..., \"{target_language}\": ...}}")
            names = [source_language, target_language]
            for language in names:
                if language not in sentences:
                    raise DataFileError(f"{where}: {translation_column} has no {language!r} sentence; its languages: "
                                        f"{', '.join(map(str, sentences)) or 'none'}")
            pair = [sentences[language] for language in names]
        for name, sentence in zip(names, pair, strict=True):
            if not isinstance(sentence, str):
                raise DataFileError(f"{where}: the {name} sentence {sentence!r} is not a string")
        sources.append(pair[0])
        targets.append(pair[1])
    return _kept_pairs(sources, targets, str(path), str(path))
