"""Writing files whole or not at all: under a temporary name beside the target, then renamed over it,
so a crash or a kill never leaves a half-written file where a reader looks."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomically(path: str | Path, text: str, tag: str | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; the folder must exist. The temporary name is
    ``.NAME.tmp-TAG``: a run passes its token (debris it can prove is its own), the default is the pid."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp-{tag or os.getpid()}")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path
