"""The package's source files and their syntax trees, each parsed once per test process for the tests
that read them (the import graph, the size limits): parsing the whole package costs about 2 s."""

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tformer"
SOURCES = sorted(PACKAGE.rglob("*.py"))


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """The syntax tree of one of the package's files."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))
