"""A run folder's two rules: one writer at a time, and nothing tformer did not write is deleted.

* ``RunLock``: an exclusive ``fcntl.flock`` on ``RUN/.tformer.lock`` (holding the holder's pid),
  taken before a run touches RUN and kept until it ends (the file is removed then). The
  operating system drops the lock when the process ends, however it ends, so a SIGKILL leaves
  at most a lock file that nobody holds, never a stale lock; a second process is refused,
  naming the holder's pid.
* A fresh run starts only in an empty folder (``contents``: what is there besides the lock), in a
  tformer run that stopped before its first usable checkpoint when a resume was asked for
  (``is_unfinished_run``: it starts again at step 0), or with ``overwrite``, which moves the old
  contents aside into the sibling folder ``RUN.replaced-N`` (``move_aside``), never deleting them.
* A run's temporary files and folders carry its token in their names (``run_token``: a random
  string recorded in its training_config.json), so that the debris a killed run leaves can be told
  from anything else: only names with the token of the run the folder holds are ever removed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from pathlib import Path

from tformer import files
from tformer.training.config import TrainingError

LOCK_NAME = ".tformer.lock"
TRAINING_CONFIG_NAME = "training_config.json"
# What a run writes into its folder (the final model, its records, its checkpoints).
RUN_ENTRIES = frozenset({TRAINING_CONFIG_NAME, "recipe.toml", "metrics.jsonl", "tensorboard", "checkpoints",
                         "config.json", "model.safetensors", "tokenizer.json", "loss_curve.png"})
RUN_TOKEN_KEY = "run_token"  # in training_config.json: the token the run's temporary names carry
RUN_TOKEN_PATTERN = re.compile(r"^[0-9a-f]{16}$")


class RunFolderBusy(TrainingError):
    """Another process holds the run folder's lock."""


class RunLock:
    """The exclusive lock of one run folder, held by this process between ``acquire`` and ``release``."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._handle = None

    @property
    def held(self) -> bool:
        return self._handle is not None

    def acquire(self) -> None:
        """Take the lock (the folder must exist), or raise ``RunFolderBusy`` naming the holder."""
        path = self.folder / LOCK_NAME
        while self._handle is None:
            handle = open(path, "a+", encoding="ascii")  # noqa: SIM115 (kept open while held)
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip()
                handle.close()
                who = f"pid {holder}" if holder.isdigit() else "a process that is starting"
                raise RunFolderBusy(f"{self.folder} is in use by another tformer run ({who}); wait for it to end, "
                                    "or choose another --out") from None
            if not _same_file(handle, path):  # its holder removed it while we opened it: take the new one
                handle.close()
                continue
            handle.truncate(0)
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            self._handle = handle

    def release(self) -> None:
        """Remove the lock file and let go (a process that opened it meanwhile sees it gone and retries)."""
        if self._handle is not None:
            (self.folder / LOCK_NAME).unlink(missing_ok=True)
            self._handle.close()
            self._handle = None


def _same_file(handle, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def contents(folder: Path) -> list[str]:
    """The names in ``folder`` besides its lock file, sorted (none when it does not exist)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(entry.name for entry in folder.iterdir() if entry.name != LOCK_NAME)


def is_unfinished_run(folder: Path) -> bool:
    """Whether ``folder`` holds only what a tformer run writes, without a final model: a run that
    stopped before its first usable checkpoint (the caller has found none to resume from)."""
    names = set(contents(folder))
    return TRAINING_CONFIG_NAME in names and "model.safetensors" not in names and names <= RUN_ENTRIES


def run_token(folder: Path) -> str | None:
    """The token of the run ``folder`` holds (recorded in its training_config.json), or None when it
    holds no tformer run that recorded one: then none of its entries is tformer's debris."""
    path = Path(folder) / TRAINING_CONFIG_NAME
    try:
        saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    token = saved.get(RUN_TOKEN_KEY) if isinstance(saved, dict) else None
    return token if isinstance(token, str) and RUN_TOKEN_PATTERN.match(token) else None


def new_run_token() -> str:
    """A fresh random run token (16 hexadecimal digits)."""
    return secrets.token_hex(8)


def describe(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def move_aside(folder: Path) -> Path:
    """Move everything in ``folder`` but its lock into a new sibling ``NAME.replaced-N``; return it."""
    return files.move_aside(folder, contents(folder))
