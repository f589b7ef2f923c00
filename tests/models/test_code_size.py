"""Size limits on the package's code (issue 54): no file in tformer/ over 600 lines and no function
over 80, so each module stays one idea a reader can hold and each function one step."""

import ast

from package_sources import ROOT, SOURCES, syntax_tree

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _function_lengths(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(qualified name, first line, number of lines) of every function and method in a module's syntax tree,
    counted from its ``def`` line (decorators left out) to its last line."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_function_lengths_count_methods_and_nested_functions_from_def_to_last_line():
    source = "class A:\n    @property\n    def b(self):\n        def c():\n            pass\n        return 1\n"
    assert _function_lengths(ast.parse(source)) == [("A.b", 3, 4), ("A.b.c", 4, 2)]
    assert len(SOURCES) > 50  # the package is found


def test_no_file_is_over_600_lines():
    too_long = [f"{path.relative_to(ROOT)} ({lines} lines)" for path in SOURCES
                if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES]
    assert not too_long, f"files over {MAX_FILE_LINES} lines: " + ", ".join(too_long)


def test_no_function_is_over_80_lines():
    too_long = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)" for path in SOURCES
                for name, line, length in _function_lengths(syntax_tree(path))
                if length > MAX_FUNCTION_LINES]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: " + ", ".join(too_long)
