"""The generation protocol is declared, not probed: nothing in generation/ or serving/ asks a model whether it has an
attribute (hasattr, or getattr with a default), and generation/ reaches nothing of nn/ (what it needs of a model's
layers, the model offers: tformer/models/generation_protocol.py)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tformer"
EDGES = sorted([*(PACKAGE / "generation").rglob("*.py"), *(PACKAGE / "serving").rglob("*.py")])


def model_probes(path: Path) -> list[str]:
    """``hasattr(x, ...)`` / ``getattr(x, ..., default)`` calls whose ``x`` names a model (a config is data)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        probing = node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3)
        target = ast.unparse(node.args[0])
        if probing and ("model" in target or "decoder" in target) and not target.endswith("config"):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", EDGES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_no_model_is_probed_for_an_attribute(path):
    assert model_probes(path) == []


def test_the_probe_finder_finds_probes(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("a = hasattr(model, 'step')\nb = getattr(self.model, 'x', None)\nc = getattr(config, 'y', 1)\n")
    assert [line.split(":")[1] for line in model_probes(sample)] == ["1", "2"]


@pytest.mark.parametrize("path", sorted((PACKAGE / "generation").glob("*.py")), ids=lambda path: path.name)
def test_generation_imports_nothing_of_nn(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert sorted(name for name in imported if name == "tformer.nn" or name.startswith("tformer.nn.")) == []
