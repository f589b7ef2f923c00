"""The base of every error a user can cause (bad config, file, argument): the command line
prints its one-line message and exits with status 2, without a traceback; and the warnings that point at the
user's own call."""

import sys
import warnings
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parent)


class TformerError(ValueError):
    """A user-facing error whose message names what is wrong and what is allowed."""


QUOTE_LIMIT = 60  # characters of a user's value quoted in a message
LIST_LIMIT = 10  # names listed in a message before "..."


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters: a value read from a file (a whole
    sentence in a label column) must not turn a one-line error into a page."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}... ({len(str(value)):,} characters)"


def listed(names, limit: int = LIST_LIMIT, width: int = 4 * QUOTE_LIMIT) -> str:
    """Names joined by commas for a message: each cut as ``quoted`` cuts, at most ``limit`` of them and about
    ``width`` characters, then how many there are in all."""
    names = [str(name) for name in names]
    shown: list[str] = []
    for name in names[:limit]:
        if shown and len(", ".join(shown)) + len(name) > width:
            break
        shown.append(name if len(name) <= QUOTE_LIMIT else quoted(name))
    more = f", ... ({len(names):,} in all)" if len(shown) < len(names) else ""
    return ", ".join(shown) + more


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointed at the first frame outside tformer (the user's ``tformer.load(...)`` line),
    however deep inside tformer the problem is found: a fixed ``stacklevel`` breaks whenever a function is split."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
