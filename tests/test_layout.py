"""Bar-style checks of the code's layout (docs/layout.md): no import circle, no module over 600 lines, and the
layout table held to the import-linter contracts and to the real imports.

Imports are read from the source with ``ast`` — at module level, inside functions (lazy imports) and under
``TYPE_CHECKING`` alike — so a circle kept apart only by a function-level import is still a circle here.
``from P import x`` counts as importing ``P`` (its ``__init__`` runs first) and ``P.x`` when that is a module.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600
ENTRY_POINTS = {"ampe.__main__": "ampe.cli"}  # modules counted with a package: `python -m ampe` is the CLI


@dataclass(frozen=True)
class Edge:
    """One import: the importing module, the module imported, where, and whether inside a function."""

    source: str
    target: str
    line: int
    lazy: bool


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder under ``root``): dotted name → file."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of ``known`` (an attribute import names its module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(root: Path, package: str) -> list[Edge]:
    """Every import of a module of ``package`` by a module of ``package``."""
    known = modules(root, package)
    out: list[Edge] = []
    for mod, path in known.items():
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

        def visit(node: ast.AST, lazy: bool, mod: str = mod, here: str = here) -> Iterator[Edge]:
            for child in ast.iter_child_nodes(node):
                inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        target = _resolve(alias.name, known)
                        if target is not None:
                            yield Edge(mod, target, child.lineno, inner)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = here.split(".")[: len(here.split(".")) - (child.level - 1)]
                        name = ".".join(base + ([child.module] if child.module else []))
                    else:
                        name = child.module or ""
                    target = _resolve(name, known)
                    if target is None:
                        continue
                    yield Edge(mod, target, child.lineno, inner)
                    for alias in child.names:
                        if f"{name}.{alias.name}" in known:
                            yield Edge(mod, f"{name}.{alias.name}", child.lineno, inner)
                yield from visit(child, inner)

        out.extend(e for e in visit(ast.parse(path.read_text(), str(path)), False) if e.target != mod)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def package_of(module: str) -> str:
    """The table's package of a module: ``ampe.x`` for anything under ``ampe/x``, ``ampe`` for the root."""
    if module in ENTRY_POINTS:
        return ENTRY_POINTS[module]
    return ".".join(module.split(".")[:2])


def _describe(comp: list[str], edges: list[Edge], key=lambda m: m) -> str:
    inside = set(comp)
    return "; ".join(f"{e.source}:{e.line}{' (lazy)' if e.lazy else ''} -> {e.target}" for e in edges
                     if key(e.source) in inside and key(e.target) in inside and key(e.source) != key(e.target))


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return imports(ROOT, "ampe")


# --- (a) no circles ----------------------------------------------------------------------------------------------
def test_no_import_circle_between_modules(edges):
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    found = cycles(graph)
    assert not found, "import circles: " + " | ".join(_describe(c, edges) for c in found)


def test_no_import_circle_between_packages(edges):
    graph: dict[str, set[str]] = {}
    for e in edges:
        a, b = package_of(e.source), package_of(e.target)
        if a != b:
            graph.setdefault(a, set()).add(b)
    found = cycles(graph)
    assert not found, "package circles: " + " | ".join(_describe(c, edges, package_of) for c in found)


def test_the_import_pass_sees_function_level_and_package_circles(tmp_path):
    """The detector on a planted package: a circle kept apart by a function-level import, one through a package's
    ``__init__`` (``from pkg import sibling``), and a one-way lazy import that is no circle."""
    pkg = tmp_path / "demo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from demo.b import g\n\ndef f():\n    from demo import a\n")
    (pkg / "b.py").write_text("def g():\n    from demo.a import f\n    return f\n")
    (pkg / "c.py").write_text("def h():\n    import demo.b as b\n    return b\n")
    (pkg / "sub" / "__init__.py").write_text("from demo.sub.x import y\n")
    (pkg / "sub" / "x.py").write_text("from demo.sub import z\ny = 1\n")
    (pkg / "sub" / "z.py").write_text("")
    found = imports(tmp_path, "demo")
    graph: dict[str, set[str]] = {}
    for e in found:
        graph.setdefault(e.source, set()).add(e.target)
    assert sorted(cycles(graph)) == [["demo.a", "demo.b"], ["demo.sub", "demo.sub.x"]]
    lazy = {(e.source, e.target) for e in found if e.lazy}
    assert ("demo.b", "demo.a") in lazy and ("demo.c", "demo.b") in lazy
    assert ("demo.a", "demo") in {(e.source, e.target) for e in found}  # `from demo import a` runs demo/__init__


# --- (b) no long module ------------------------------------------------------------------------------------------
def test_no_module_over_600_lines():
    long = {m: n for m, p in modules(ROOT, "ampe").items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split by responsibility): {long}"


# --- (c) docs/layout.md against the contracts and the real imports -------------------------------------------------
def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layers() -> list[list[str]]:
    """The layers contract's layers, top first; each a list of packages (siblings split on ``|`` or ``:``)."""
    (contract,) = [c for c in _contracts() if c["type"] == "layers"]
    return [[p.strip() for p in re.split(r"[|:]", layer)] for layer in contract["layers"]]


def _table() -> dict[str, set[str] | None]:
    """docs/layout.md's table: package → the packages it may import (full names), or None for "every package"."""
    rows: dict[str, set[str] | None] = {}
    for line in (ROOT / "docs" / "layout.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`ampe"):
            continue
        names = re.findall(r"`(ampe[\w.]*)`", cells[0])
        allowed: set[str] | None
        if "every package" in cells[3]:
            allowed = None
        else:
            allowed = {f"ampe.{n}" for n in re.findall(r"`(\w+)`", cells[3]) if not n.startswith("ampe")}
            allowed |= {"ampe"} if "the root's version" in cells[3] else set()
        for name in names:
            if name in ENTRY_POINTS:
                continue
            assert name not in rows, f"docs/layout.md lists {name} twice"
            rows[name] = allowed
    return rows


def test_each_contract_name_states_its_own_list():
    for c in _contracts():
        if c["type"] == "layers":
            stated = " > ".join(" | ".join(p.removeprefix("ampe.") for p in layer) for layer in _layers())
            assert c["name"] == f"Layers, top to bottom: {stated}"
        else:
            sources, banned = ", ".join(c["source_modules"]), ", ".join(c["forbidden_modules"])
            verb = "imports" if len(c["source_modules"]) == 1 else "import"
            assert c["name"].startswith(f"{sources} {verb} none of: {banned}"), c["name"]


def test_the_table_names_the_contracts_packages():
    layered = {p for layer in _layers() for p in layer}
    table = _table()
    assert set(table) - {"ampe"} == layered
    assert table["ampe"] == set()  # the root holds the version and imports nothing: every layer may read it
    on_disk = {package_of(m) for m in modules(ROOT, "ampe")}
    assert on_disk == set(table), "a package of ampe/ is missing from the table (or the table names a gone one)"


def test_the_table_allows_only_lower_layers():
    rank = {p: i for i, layer in enumerate(_layers()) for p in layer}
    for pkg, allowed in _table().items():
        if pkg == "ampe" or allowed is None:
            continue
        for dep in allowed - {"ampe"}:
            assert dep in rank, f"{pkg} may import {dep}, which no contract layer names"
            assert rank[dep] > rank[pkg], f"docs/layout.md lets {pkg} import {dep}, a layer not below it"


def test_real_imports_are_within_the_table(edges):
    table = _table()
    outside = sorted({(package_of(e.source), package_of(e.target), f"{e.source}:{e.line}") for e in edges
                      if package_of(e.source) != package_of(e.target)
                      and (allowed := table[package_of(e.source)]) is not None
                      and package_of(e.target) not in allowed})
    assert not outside, "imports the table does not allow: " + "; ".join(f"{a} -> {b} ({w})" for a, b, w in outside)


def test_the_tradeoff_core_is_forbidden_every_other_package():
    """ampe.tradeoff is domain-free: its forbidden contract names every other package of ampe, new ones included."""
    (contract,) = [c for c in _contracts() if c.get("source_modules") == ["ampe.tradeoff"]]
    packages = {package_of(m) for m in modules(ROOT, "ampe")} - {"ampe", "ampe.tradeoff"}
    assert set(contract["forbidden_modules"]) == packages


MAX_FUNCTION_LINES = 80
# Today's longer functions (lines from the `def` or its first decorator to the end, docstring included): each may
# only shrink, and leaves this list once it is within MAX_FUNCTION_LINES. No new entry: split the function instead.
LONG_FUNCTIONS = {
    "ampe/costmodel/cluster.py::cluster_from_dict": 118,
    "ampe/tradeoff/direct.py::relaxed_plan": 112,
    "ampe/costmodel/tables.py::stage_tables": 101,
    "ampe/energy/ranking.py::rank_strategies": 97,
    "ampe/trials/runner.py::run_trials": 97,
    "ampe/search/cluster_replan.py::replan_cluster": 99,
    "ampe/cli/search.py::_print": 90,
    "ampe/cli/profile.py::run": 88,
    "ampe/trials/runner.py::run_one": 87,
    "ampe/trials/export.py::export_plan": 83,
    "ampe/cli/search.py::register": 90,
    "ampe/trials/export.py::readme": 83,
    "ampe/costmodel/strategy.py::strategy_from_dict": 82,
}


def _function_lines() -> dict[str, int]:
    """``path::name`` → lines of every function in ampe/ (the longest where a module has two of one name)."""
    out: dict[str, int] = {}
    for path in sorted((ROOT / "ampe").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                key = f"{path.relative_to(ROOT).as_posix()}::{node.name}"
                out[key] = max(out.get(key, 0), (node.end_lineno or node.lineno) - start + 1)
    return out


def test_no_function_over_80_lines_beyond_the_shrinking_list():
    lines = _function_lines()
    over = {k: n for k, n in lines.items() if n > MAX_FUNCTION_LINES and k not in LONG_FUNCTIONS}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split them): {over}"
    grown = {k: (lines[k], n) for k, n in LONG_FUNCTIONS.items() if lines.get(k, 0) > n}
    assert not grown, f"listed long functions grew (now, allowed): {grown}"
    done = [k for k, n in LONG_FUNCTIONS.items() if lines.get(k, 0) <= MAX_FUNCTION_LINES]
    assert not done, f"within {MAX_FUNCTION_LINES} lines now or gone: remove from LONG_FUNCTIONS: {done}"
    tighter = {k: lines[k] for k, n in LONG_FUNCTIONS.items() if MAX_FUNCTION_LINES < lines.get(k, 0) < n}
    assert not tighter, f"listed long functions shrank: lower their entries to {tighter}"
