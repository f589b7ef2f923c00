"""Text corpora that need no download."""

from __future__ import annotations

from pathlib import Path

from tformer.errors import TformerError


def builtin_corpus() -> str:
    """The English documentation every CPython ships (``pydoc_data.topics``, about 465 KB)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in sorted(topics))


def read_text_file(path: str | Path) -> str:
    """A user's UTF-8 text file, with a clear error when it is missing, binary or empty."""
    file = Path(path)
    if not file.is_file():
        raise TformerError(f"{file}: no such file")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise TformerError(f"{file}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not text.strip():
        raise TformerError(f"{file}: the file is empty")
    return text
