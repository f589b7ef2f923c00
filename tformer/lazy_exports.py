"""Packages whose exported names load on first use (PEP 562): the package lists each name's module, and its
``__getattr__`` imports that module the first time the name is asked for, so importing the package loads none
of them (the HTTP server's process imports ``tformer.serving`` and ``tformer.data.audio`` without torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose name ``NAME`` is ``exports[NAME]``'s (a module's
    full name); a name once loaded is kept in the package's namespace."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace["__all__"]})

    return __getattr__, __dir__
