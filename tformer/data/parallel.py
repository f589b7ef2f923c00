"""Parallel text for translation: two files of one sentence a line, line i of one the translation of
line i of the other. A corpus is named by its prefix and two language codes (``train`` + ``de``/``en``:
``train.de`` and ``train.en``, or ``train.de.gz`` and ``train.en.gz``), as fairseq and Moses name them.

Files of different line counts are refused naming both counts; pairs with an empty side are left out and
counted. Lines are split on "\\n" only (a Unicode line separator inside a sentence is not a new line).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tformer.data.files import DataFileError, read_data_text


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
        return f"{Path(self.source_path).name} + {Path(self.target_path).name}: {len(self):,} pairs{skipped}"


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
    kept_sources, kept_targets = [], []
    for source, target in zip(sources, targets, strict=True):
        source, target = source.strip(), target.strip()
        if source and target:
            kept_sources.append(source)
            kept_targets.append(target)
    if not kept_sources:
        raise DataFileError(f"{source_path} and {target_path} hold no pair of non-empty lines")
    return ParallelText(kept_sources, kept_targets, str(source_path), str(target_path),
                        len(sources) - len(kept_sources))
