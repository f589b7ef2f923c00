"""The import graph: every tformer module imports on its own in a fresh interpreter; outside
the command line, no module imports tformer inside a function (a hidden dependency, usually a
cycle worked around); and the module-level import graph has no cycle."""

import ast
import functools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from package_sources import PACKAGE, ROOT, SOURCES, syntax_tree
from python_path import child_python_path


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in SOURCES if path.name != "__main__.py"}


@pytest.mark.slow  # a subprocess per module
def test_every_module_imports_on_its_own():
    # One interpreter imports the third-party libraries once, then forks a child per module. The
    # child starts with no tformer module loaded and a bare ``tformer`` package (its __init__,
    # which imports everything, not run), so the module's own imports are all that load it.
    script = textwrap.dedent("""
        import importlib, os, sys, traceback, types
        import numpy, pydantic, regex, safetensors.torch, starlette.applications, torch, tqdm  # noqa: F401
        # (the third-party libraries tformer's modules import at their top, shared by every child)
        failures = []
        for name in sys.argv[2:]:
            pid = os.fork()
            if pid == 0:
                try:
                    if name != "tformer":
                        package = types.ModuleType("tformer")
                        package.__path__ = [sys.argv[1]]
                        sys.modules["tformer"] = package
                    importlib.import_module(name)
                except BaseException:
                    traceback.print_exc()
                    os._exit(1)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            if status != 0:
                failures.append(name)
        print("FAILED:", " ".join(failures))
        sys.exit(1 if failures else 0)
    """)
    environment = {"PYTHONPATH": child_python_path(), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script, str(PACKAGE), *MODULES], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]


def _imported_tformer_modules(node: ast.AST) -> list[str]:
    """The tformer modules an import statement loads (none for any other node)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "tformer"]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tformer":
        # ``from tformer.x import y`` loads tformer.x.y when y is a module, else tformer.x
        return [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                for alias in node.names]
    return []


def _tformer_imports(tree: ast.AST) -> list[tuple[ast.AST, list[str]]]:
    """(node, imported tformer module names) for each import statement naming tformer."""
    return [(node, names) for node in ast.walk(tree) if (names := _imported_tformer_modules(node))]


def _imports_inside_functions(tree: ast.AST) -> list[ast.AST]:
    """The import statements naming tformer that sit in a function or lambda, each once (one walk)."""
    found = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_inside = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if child_inside and _imported_tformer_modules(child):
                found.append(child)
            visit(child, child_inside)

    visit(tree, False)
    return found


def _trees() -> dict[str, ast.AST]:
    """Every module's syntax tree (parsed once per process: package_sources)."""
    return {name: syntax_tree(path) for name, path in MODULES.items()}


def test_imports_inside_functions_are_found_at_any_depth_and_module_level_ones_are_not():
    source = ("import tformer.config\n"
              "class A:\n    def f(self):\n        def g():\n            from tformer import errors\n"
              "        h = lambda: __import__('os')\n        import tformer.files\n")
    assert [node.lineno for node in _imports_inside_functions(ast.parse(source))] == [5, 7]


def test_no_module_outside_the_cli_imports_tformer_inside_a_function():
    offenders = []
    for name, tree in _trees().items():
        if name.startswith("tformer.cli"):
            continue
        offenders += [f"{MODULES[name].relative_to(ROOT)}:{node.lineno}" for node in _imports_inside_functions(tree)]
    assert not offenders, "imports of tformer inside functions: " + ", ".join(offenders)


def test_module_import_graph_has_no_cycle():
    graph = _module_graph()
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = "open"
        for target in sorted(graph.get(name, ())):
            if state.get(target) == "open":
                return [*path, name, target]
            if target not in state and (cycle := visit(target, [*path, name])):
                return cycle
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name, [])
            assert cycle is None, "import cycle: " + " -> ".join(cycle[cycle.index(cycle[-1]):])


@functools.cache
def _module_graph() -> dict[str, set[str]]:
    """Each module -> the tformer modules it imports (at any depth of its code)."""
    return {name: {target for _, names in _tformer_imports(tree) for target in names if target != name}
            for name, tree in _trees().items()}


# The package's parts from the ground floor up: a module imports only from its own part or from parts below it.
# The config and the registries it validates against (families, choices) are the floor; nn/ the layers;
# models/ the families built from them; commands on top.
LAYERS = ("errors", "lazy_exports", "files", "memory", "profiling", "pooling", "families", "choices", "config",
          "tokenizers", "nn", "quantization", "cpu_threads", "data", "evaluation", "checkpoint", "hub_cache", "interop",
          "adapters", "models", "generation", "serving", "hub", "viz", "training", "cli", "__main__")


def _part(module: str) -> str:
    """tformer.nn.attention.sdpa -> nn; tformer.config -> config; the package's own __init__ -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_config_imports_only_the_ground_floor():
    assert _module_graph()["tformer.config"] <= {"tformer.errors", "tformer.families", "tformer.choices"}


def test_no_module_imports_from_a_part_above_its_own():
    upward = sorted(
        f"{name} -> {target}" for name, targets in _module_graph().items() for target in targets
        if _part(name) and _part(target) and LAYERS.index(_part(target)) > LAYERS.index(_part(name))
    )
    assert not upward, "imports from a higher part: " + ", ".join(upward)
    parts = {_part(name) for name in MODULES if _part(name)}
    assert parts <= set(LAYERS), f"parts missing from LAYERS: {sorted(parts - set(LAYERS))}"
