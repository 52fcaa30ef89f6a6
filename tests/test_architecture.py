"""docs/ARCHITECTURE.md checked against the source, so that it cannot drift.

- The layering: imports point down the layers of the doc's layer table (which must equal
  ``ALLOWED``), there is no import cycle, costmodel never imports torch, and what the app
  and the published-run comparison load is torch-free.
- The names: every module under costmodel/, validate/ and explorer/ (and app.py) is named
  in the doc's "Modules" section, packages by their folder (``costmodel/engine/``), the
  rest by path or dotted name, ``__init__``/``__main__`` files included; every path and
  every dotted name the doc writes in backticks exists (a module, a top-level name of it,
  or a member of a class).
- One place per framework: no module of costmodel outside costmodel/frameworks/ compares
  a framework name.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from costmodel.specs.frameworks import FRAMEWORKS

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("costmodel", "validate", "explorer")
# layer -> the costmodel layers it may import (itself included). A framework's facts are
# data in specs (specs/frameworks.py: traits, defaults, rules), which every layer reads; its
# pricing (costmodel/frameworks/, the registry included) builds on parallel, which never
# imports it: the engine hands parallel a layout's framework (``specs.frameworks.Pricing``).
ALLOWED = {
    "symbols": {"symbols"},
    "units": {"units"},
    "specs": {"specs"},
    "catalog": {"catalog", "specs"},
    "kinds": {"kinds", "specs", "symbols"},
    "single": {"single", "kinds", "specs", "symbols"},
    "parallel": {"parallel", "kinds", "single", "specs", "symbols"},
    "frameworks": {"frameworks", "kinds", "parallel", "single", "specs", "symbols"},
    "config": {"config", "specs"},
    "engine": {
        "engine",
        "config",
        "frameworks",
        "kinds",
        "parallel",
        "single",
        "specs",
        "symbols",
        "catalog",
    },
    "serving": {"serving", "catalog", "kinds", "single", "specs", "symbols"},
    "answers": {"answers", "serving", "engine", "catalog", "kinds", "specs", "units"},
    "rl": {"rl", "api", "engine", "serving", "catalog", "specs"},
    "book": {"book", "engine", "frameworks", "kinds", "parallel", "single", "specs", "symbols"},
    "inputs": {"inputs", "config", "catalog", "engine", "single", "specs"},
    "cli": {
        "cli",
        "inputs",
        "engine",
        "book",
        "serving",
        "answers",
        "rl",
        "catalog",
        "single",
        "specs",
        "units",
    },
    "api": {"api", "inputs", "engine", "answers", "catalog", "specs"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


@cache
def _modules(package: str = "costmodel") -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


def _all_modules() -> dict[str, Path]:
    found = {name: path for pkg in PACKAGES for name, path in _modules(pkg).items()}
    return {**found, "app": ROOT / "app.py"}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, deferred) for each absolute import of a file, at any depth;
    deferred: inside a function or under ``if TYPE_CHECKING`` (not run when loaded).
    ``from a.b import c`` imports the module ``a.b.c`` where that is a module."""
    known = {name for pkg in PACKAGES for name in _modules(pkg)}
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            named = [s for s in subs if s in known]
            out.extend((s, deferred) for s in named or [node.module])
        elif isinstance(node, ast.Import):
            out.extend((a.name, deferred) for a in node.names)
        inner = deferred or _type_checking(node)
        inner |= isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _doc() -> str:
    return DOC.read_text()


def _section(title: str) -> str:
    text = _doc()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_docs_layer_table_is_the_checked_one():
    """Rows ``| `layer` | … | `may`, `import` |`` of the Layers section equal ALLOWED."""
    table = {}
    for line in _section("Layers").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[\w.]+`", cells[0]):
            table[cells[0].strip("`")] = {*re.findall(r"`([\w.]+)`", cells[2]), cells[0][1:-1]}
    assert table == ALLOWED


def test_costmodel_imports_point_down_the_layers():
    for name, path in _modules().items():
        layer = _layer(name)
        if layer not in ALLOWED:
            continue  # the package root and __main__ re-export the front
        for target, _ in _imports(path):
            if target == "costmodel" or target.startswith("costmodel."):
                to = _layer(target)
                assert to in ALLOWED[layer], f"{name} imports {target}"
            assert not target.startswith(("torch", "validate", "explorer")), f"{name}: {target}"


def test_no_import_cycle_between_costmodel_modules():
    mods = _modules()
    graph = {n: {t for t, _ in _imports(p) if t in mods and t != n} for n, p in mods.items()}
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
        "costmodel, costmodel.cli, costmodel.inputs, costmodel.engine.inverse, "
        "costmodel.engine.plan, " + ", ".join(f"costmodel.frameworks.{f}" for f in FRAMEWORKS),
        "validate.report.render, validate.report.results, explorer.results, "
        "validate.published.compare, validate.published.report",
    ],
)
def test_no_torch_where_nothing_runs(modules):
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _named(text: str) -> set[str]:
    """The backticked words of ``text`` (a trailing call's parentheses dropped)."""
    words = set()
    for token in re.findall(r"`([^`\n]+)`", text):
        words.update(re.sub(r"\(.*\)$", "", w) for w in token.split())
    return words


def test_every_module_is_named_in_the_modules_section():
    named = _named(_section("Modules"))
    missing = []
    for name, path in _all_modules().items():
        rel = path.relative_to(ROOT)
        forms = {name, rel.as_posix()}
        if path.name == "__init__.py":
            forms = {name, f"{rel.parent.as_posix()}/"}
        if not forms & named:
            missing.append(rel.as_posix())
    assert not missing, f"not named in the Modules section of {DOC.name}: {missing}"


def _members(tree: ast.Module) -> dict[str, set[str] | None]:
    """Top-level name -> the names its class body defines (None: not a class)."""
    out: dict[str, set[str] | None] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            inner = set()
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    inner.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    inner.add(sub.target.id)
                elif isinstance(sub, ast.Assign):
                    inner.update(t.id for t in sub.targets if isinstance(t, ast.Name))
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            out[node.name] = inner | {f"<base>{b}" for b in bases}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = None
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update((t.id, None) for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            out.update(((a.asname or a.name).split(".")[0], None) for a in node.names)
    return out


@cache
def _classes() -> dict[str, set[str]]:
    """Class name -> its members, inherited ones included (costmodel's classes)."""
    direct = {}
    for path in _modules().values():
        for name, inner in _members(ast.parse(path.read_text())).items():
            if inner is not None:
                direct.setdefault(name, set()).update(inner)

    def members(name: str, seen: frozenset = frozenset()) -> set[str]:
        own = direct.get(name, set())
        bases = {m[6:] for m in own if m.startswith("<base>")} - seen
        return own.union(*(members(b, seen | {name}) for b in bases))

    return {name: members(name) for name in direct}


def _resolves(dotted: str) -> bool:
    """A module, a module's top-level name, or a class's member (``Class.member``)."""
    modules = _all_modules()
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module not in modules:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        top = _members(ast.parse(modules[module].read_text()))
        if rest[0] not in top:
            return False
        if len(rest) == 1:
            return True
        inner = top[rest[0]]  # a class's own members, and those it inherits in costmodel
        inner = None if inner is None else inner | _classes().get(rest[0], set())
        return inner is not None and len(rest) == 2 and rest[1] in inner
    return False


def test_every_name_in_the_doc_exists():
    """Paths under the repository's folders exist; dotted names rooted at a package, at a
    costmodel layer (``config.check`` is ``costmodel.config.check``) or at a costmodel
    class (``Framework.state``) resolve."""
    layers = {n.split(".")[1] for n in _modules() if "." in n} | {"frameworks"}
    folders = {*PACKAGES, "docs", "tests", "notebooks", "benchmarks", "scripts"}
    stale = []
    for word in _named(_doc()):
        head = re.split(r"[./]", word)[0]
        if "/" in word or word.endswith((".py", ".json", ".md", ".ipynb")):
            if head in folders or word == "app.py":
                ok = (ROOT / word).exists()
            elif "/" in word and head in layers:  # a path inside costmodel/
                ok = (ROOT / "costmodel" / word).exists()
            else:
                continue  # a file name in prose (``config.json``, ``report.md``)
            if not ok:
                stale.append(word)
        elif re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", word):
            if head in PACKAGES:
                ok = _resolves(word)
            elif head in layers:
                ok = _resolves(f"costmodel.{word}")
            elif head in _classes():
                ok = word.split(".")[1] in _classes()[head] and word.count(".") == 1
            else:
                continue  # a quantity key or a field path, not a name of the code
            if not ok:
                stale.append(word)
    assert not stale, f"{DOC.name} names what does not exist: {sorted(stale)}"


def _framework_word(node: ast.AST) -> bool:
    """``framework``, ``x.framework``, a framework's name, or a tuple/list/set of them."""
    if isinstance(node, ast.Name | ast.Attribute):
        return (node.id if isinstance(node, ast.Name) else node.attr) == "framework"
    if isinstance(node, ast.Constant):
        return node.value in FRAMEWORKS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_framework_word(e) for e in node.elts)
    return False


def framework_comparisons(source: str) -> list[int]:
    """Lines comparing a framework (==, !=, in, not in) or matching one by name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            equality = any(isinstance(o, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for o in node.ops)
            if equality and any(_framework_word(s) for s in (node.left, *node.comparators)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Match):
            values = [p.value for c in node.cases for p in ast.walk(c.pattern)
                      if isinstance(p, ast.MatchValue)]  # fmt: skip
            if _framework_word(node.subject) or any(_framework_word(v) for v in values):
                lines.append(node.lineno)
    return sorted(lines)


def test_the_framework_check_finds_comparisons():
    found = framework_comparisons(
        "a = par.framework == 'fsdp2'\nb = 'megatron' != x\nc = f in ('deepspeed', 'y')\n"
        "d = framework not in s\ne = par.zero == 3\nmatch par.framework:\n    case _: pass\n"
    )
    assert found == [1, 2, 3, 4, 6]


def test_no_framework_name_is_compared_outside_the_framework_modules():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in _modules().items()
        if not name.startswith("costmodel.frameworks")
        for line in framework_comparisons(path.read_text())
    ]
    assert not found, f"framework comparisons outside costmodel/frameworks/: {found}"


KIND_FLAGS = ("moe", "mla")
"""ModelSpec properties that name a model kind (an FFN kind, an attention projection kind)."""
KIND_FIELDS = ("ffn",)
"""ModelSpec fields whose value is a kind (the FFN's activation)."""
KIND_OWNERS = ("costmodel.kinds", "costmodel.specs", "costmodel.catalog", "costmodel.config")
"""Where a kind may be named: the kinds themselves, the specs that define the fields and
their rules, the catalog that maps configs onto them, and the rule table."""


def kind_branches(source: str) -> list[int]:
    """Lines reading a kind flag (``x.moe``, ``x.mla``) or comparing a kind field
    (``x.ffn == 'swiglu'``): what a kind module answers instead."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in KIND_FLAGS:
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = (node.left, *node.comparators)
            if any(isinstance(s, ast.Attribute) and s.attr in KIND_FIELDS for s in sides):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_the_kind_check_finds_branches():
    found = kind_branches("if model.moe:\n    pass\na = m.ffn == 'swiglu'\nb = m.mla\nc = m.ffn\n")
    assert found == [1, 3, 4]


def test_no_model_kind_is_branched_on_outside_the_kind_modules():
    """What differs between FFN kinds (dense, MoE) and attention projection kinds
    (standard, MLA) is asked of their modules (``costmodel.kinds``), never branched on."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in _modules().items()
        if name.startswith("costmodel.") and not name.startswith(KIND_OWNERS)
        for line in kind_branches(path.read_text())
    ]
    assert not found, f"kind branches outside costmodel/kinds/: {found}"
