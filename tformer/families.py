"""The families a ModelConfig may name (``architecture``), each declared beside its model class.

A family declares the config fields only some families read that it reads (``fields``: its tokens, its
heads, its images or audio, ...), its own checks of a config (``check``), whether it is built from the
shared transformer stack (``transformer``: the core's size, head and kernel checks then apply), and its named
configs (``presets``, read through ``config.PRESETS``). ModelConfig
reads these declarations when it validates: a field no declaration of the config's family names must hold
its default, so a switch never sits in a config unread. This module imports nothing of tformer's, so
config.py and the model files can both read it.

The declarations (and the choices of ``choices.py``) are made by the modules that implement them, which
``tformer.models`` imports, every family and layer. The package imports lazily (the HTTP server's process
never loads torch), so the first read of a registry makes sure they are made: ``ensure_declared`` imports
``tformer.models`` by name once, a registry discovering its entries, not a layer reaching upward.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FamilyDeclaration:
    architecture: str
    fields: frozenset[str]
    check: Callable[[Any], None] | None = None
    transformer: bool = True
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # preset name -> its config fields
    # The longest sequence any of its stacks attends over (a kernel bounding a window asks): max_seq_len by default
    longest_sequence: Callable[[Any], int] | None = None

    def sequence_limit(self, config: Any) -> int:
        """The most positions one of this family's stacks attends over for ``config``."""
        return config.max_seq_len if self.longest_sequence is None else self.longest_sequence(config)


FAMILIES: dict[str, FamilyDeclaration] = {}
DECLARING_MODULE = "tformer.models"  # importing it declares every family and registers every choice
_declaring = False


def ensure_declared() -> None:
    """Make sure every family has declared itself and every layer registered its choices (once per process; a
    config made from ``tformer.config`` in a fresh process, before anything imported the models, needs it)."""
    global _declaring
    if not _declaring:
        _declaring = True
        importlib.import_module(DECLARING_MODULE)


def declare_family(architecture: str, fields: Iterable[str] = (), check: Callable[[Any], None] | None = None,
                   transformer: bool = True, presets: Mapping[str, Mapping[str, Any]] | None = None,
                   longest_sequence: Callable[[Any], int] | None = None) -> FamilyDeclaration:
    """Declare (or declare again, as a module reload does) the family ``architecture`` with its named
    ``presets`` (each a dict of config fields; the family's own ``architecture`` is implied) and, where its
    stacks attend over other lengths than ``max_seq_len``, the ``longest_sequence`` of a config."""
    presets = {name: {"architecture": architecture, **values} for name, values in (presets or {}).items()}
    declaration = FamilyDeclaration(architecture, frozenset(fields), check, transformer, presets, longest_sequence)
    FAMILIES[architecture] = declaration
    return declaration


def families_reading(field: str) -> tuple[str, ...]:
    """The families that declare ``field``."""
    ensure_declared()
    return tuple(name for name, family in FAMILIES.items() if field in family.fields)


def declared_fields() -> frozenset[str]:
    """Every field some family declares: the fields that belong to families rather than to the core."""
    ensure_declared()
    return frozenset().union(*(family.fields for family in FAMILIES.values()))


def preset_fields() -> dict[str, Mapping[str, Any]]:
    """Every declared family's presets: name -> config fields."""
    ensure_declared()
    found: dict[str, Mapping[str, Any]] = {}
    for family in FAMILIES.values():
        found.update(family.presets)
    return found
