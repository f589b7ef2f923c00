"""Where a benchmark finds a dataset's files: in the data roots a recipe reads (``TFORMER_DATA``, ../shared/data
beside the project, then ``tformer data fetch``'s cache), so that a fresh clone whose data was fetched runs the
benchmarks as a checkout beside ../shared does. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

from tformer.data.cache import DataFetchError, resolve

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # beside the project, where it is


def data_file(path: str) -> Path:
    """A dataset's file or folder, ``NAME/FILE``, from the data roots; a DataFetchError naming the command that
    fetches the dataset where no root holds it."""
    return resolve(f"dataset:{path}", SHARED_DATA)


def data_path(path: str) -> Path:
    """``data_file``'s answer, or, where no root holds the dataset, its place in ../shared/data: for a script's
    default, read when the script is imported, which must not fail before the script can say what is missing."""
    try:
        return data_file(path)
    except DataFetchError:
        return SHARED_DATA / path
