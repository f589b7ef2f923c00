"""Writing files whole or not at all: under a temporary name beside the target, then renamed over it,
so a crash or a kill never leaves a half-written file where a reader looks; replacing a folder's
contents by moving them aside, never deleting them.

A writer killed mid-write (``kill -9``) leaves its temporary behind: ``.NAME.tmp-PID`` (being written),
``.NAME.old-PID`` (the previous NAME, renamed aside for the moment of the swap). The next write of NAME in
that folder clears them (``clear_dead_writers``) once no process PID runs on this host; a run's own
temporaries carry its token instead of a pid and are cleared by the run (``training.checkpoints``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from tformer.errors import TformerError


def write_text_atomically(path: str | Path, text: str, tag: str | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; the folder must exist. The temporary name is
    ``.NAME.tmp-TAG``: a run passes its token (debris it can prove is its own), the default is the pid."""
    return _write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"), tag)


def write_bytes_atomically(path: str | Path, data: bytes, tag: str | None = None) -> Path:
    """Write ``data`` to ``path`` atomically, as ``write_text_atomically`` writes text."""
    return _write_atomically(path, lambda temporary: temporary.write_bytes(data), tag)


def _write_atomically(path: str | Path, write, tag: str | None) -> Path:
    path = Path(path)
    if tag is None:
        clear_dead_writers(path)
    temporary = path.with_name(f".{path.name}.tmp-{tag or os.getpid()}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


PID_LIMIT = 1 << 22  # Linux's largest pid_max: a longer number in a temporary's name is a run's token, not a pid


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this host (signal 0 finds none); False where that cannot be told
    (not POSIX, another user's process, this process itself)."""
    if os.name != "posix" or pid == os.getpid() or not 0 < pid <= PID_LIMIT:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it runs, as another user
        return False
    return False


def dead_writer_pid(name: str, prefix: str) -> int | None:
    """The pid in ``name`` when it is ``prefix`` followed by a pid whose process is gone, else None."""
    rest = name.removeprefix(prefix)
    if rest == name or not rest.isdigit() or not process_gone(int(rest)):
        return None
    return int(rest)


def remove_entry(entry: Path) -> None:
    """Remove a file or a folder (a link itself, never what it points to)."""
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def clear_dead_writers(target: str | Path) -> None:
    """Clear what writers of ``target`` killed mid-write left beside it: ``.NAME.tmp-PID`` is removed, and
    ``.NAME.old-PID`` (the whole previous NAME) is renamed back to NAME when NAME is missing (the kill fell
    between the two renames of the swap), else removed; only for a PID no process runs as. Nothing else is
    touched: no other name, no temporary named by a run's token or of a live process."""
    target = Path(target)
    if not target.parent.is_dir():
        return
    for entry in sorted(target.parent.iterdir()):
        if dead_writer_pid(entry.name, f".{target.name}.old-") is not None:
            if not (target.exists() or target.is_symlink()):
                os.replace(entry, target)
                continue
        elif dead_writer_pid(entry.name, f".{target.name}.tmp-") is None:
            continue
        remove_entry(entry)


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
