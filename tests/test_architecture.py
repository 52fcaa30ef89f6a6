"""The layering of docs/ARCHITECTURE.md, checked on the source: imports point down only,
there is no import cycle, costmodel never imports torch, and validate's report is torch-free
(the app's results page imports it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# layer -> the costmodel layers it may import (itself included)
ALLOWED = {
    "symbols": {"symbols"},
    "units": {"units"},
    "specs": {"specs"},
    "catalog": {"catalog", "specs"},
    "single": {"single", "specs", "symbols"},
    "parallel": {"parallel", "single", "specs", "symbols"},
    "book": {"book", "single", "engine", "specs", "symbols"},
    "engine": {"engine", "parallel", "single", "specs", "symbols", "catalog"},
    "inputs": {"inputs", "catalog", "engine", "single", "specs"},
    "cli": {"cli", "inputs", "engine", "book", "catalog", "single", "specs", "units"},
}


def _imports(path: Path) -> set[str]:
    """Modules a file imports (absolute names), at any depth of the file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "costmodel").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        found[name] = path
    return found


def test_costmodel_imports_point_down_the_layers():
    for name, path in _modules().items():
        layer = _layer(name)
        if layer not in ALLOWED:
            continue  # the package root and __main__ re-export the front
        for target in _imports(path):
            if target.startswith("costmodel."):
                assert _layer(target) in ALLOWED[layer], f"{name} imports {target}"
            assert not target.startswith(("torch", "validate", "explorer")), f"{name}: {target}"


def test_no_import_cycle_between_costmodel_modules():
    mods = _modules()
    graph = {n: {t for t in _imports(p) if t in mods and t != n} for n, p in mods.items()}
    for pkg in [n for n in mods if mods[n].name == "__init__.py"]:
        graph[pkg] = set()  # a package's __init__ re-exports; importing a submodule runs it
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join([*path, nxt])
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])


@pytest.mark.parametrize(
    "modules",
    [
        "costmodel, costmodel.cli, costmodel.inputs, costmodel.engine.inverse",
        "validate.report.render, validate.report.results, explorer.results",
    ],
)
def test_no_torch_where_nothing_runs(modules):
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
