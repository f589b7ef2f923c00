"""Writing files whole or not at all: under a temporary name beside the target, then renamed over it,
so a crash or a kill never leaves a half-written file where a reader looks; replacing a folder's
contents by moving them aside, never deleting them."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from tformer.errors import TformerError


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


def sha256_of(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hexadecimal): what a command records of a file it wrote, to know it
    again before replacing it."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def move_aside(folder: str | Path, names: Iterable[str]) -> Path:
    """Move the entries ``names`` of ``folder`` into a new sibling folder ``NAME.replaced-N`` (the first N
    free) and return it: what ``--overwrite`` does to what an output folder held. Nothing is deleted; an
    entry that cannot be moved stops it, naming the entry."""
    folder = Path(folder).resolve()
    for number in range(1, 10_000):
        target = folder.parent / f"{folder.name}.replaced-{number}"
        try:
            target.mkdir()
            break
        except FileExistsError:
            continue
        except OSError as error:
            raise TformerError(f"--overwrite: cannot create {target} to move the old contents of {folder} into "
                               f"({error.strerror or error}); move them yourself or choose another output folder"
                               ) from None
    else:
        raise TformerError(f"--overwrite: {folder.parent} already holds {folder.name}.replaced-1 to -9999")
    for name in sorted(names):
        try:
            os.replace(folder / name, target / name)
        except OSError as error:
            raise TformerError(f"--overwrite: cannot move {folder / name} to {target} ({error.strerror or error}); "
                               "nothing was deleted") from None
    return target
