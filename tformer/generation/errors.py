"""``GenerationError``, on its own so that ``settings.py`` (which re-exports it) and the modules it imports
(``constraints.py``) can all raise it."""

from __future__ import annotations

from tformer.errors import TformerError


class GenerationError(TformerError):
    """An argument of ``generate`` is invalid; the message names it and what is allowed."""
