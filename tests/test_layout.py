"""The package's shape (issue 10, DESIGN.md "Architecture"): module and
class sizes, and which package may import which. Read from the source with
``ast``; nothing is imported."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "alloc_audit"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
MAX_CLI_LINES = 300

# Leaf helpers any layer may use: they import nothing of alloc_audit but model.
BASE = {"model", "errors", "globs", "arglists", "atomic", "__init__"}
# What each layer may import (module names relative to alloc_audit, dotted).
# A prefix allows the package and everything in it.
ALLOWED = {
    "cli": ("commands", "report", "errors", "model", "__init__"),
    # a rule sees the facts, its knobs (the pack), the shared analyses and the index facade only
    "rules.rule": ("model", "globs", "arglists", "pack", "rules.base", "rules._lib", "pipeline.index"),
    "rules._lib": ("model", "globs", "arglists", "pack", "rules._lib", "pipeline.index"),
    # the join renderers read a join's results (runtime/results.py), never the join itself
    "report": ("model", "errors", "__init__", "report", "ratchet", "rules", "pipeline.run", "pipeline.suppress",
               "runtime.results"),
    "ratchet": ("model", "errors", "atomic", "ratchet"),
}


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        yield ".".join(rel.parts), path


@functools.cache
def source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@functools.cache
def tree_of(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once per worker for the three checks
    that read it (sizes, layers, cycles); the checks only read it."""
    return ast.parse(source(path))


def imports(name: str, path: Path, top_level_only: bool = False) -> set[str]:
    """The alloc_audit modules ``name`` imports (relative imports resolved),
    leaving out ``if TYPE_CHECKING:`` blocks."""
    tree = tree_of(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if path.name == "__init__.py":
        package = package[:-1]
    out: set[str] = set()

    def visit(nodes: list[ast.stmt], top: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = [*base, *(node.module.split(".") if node.module else [])]
                for alias in node.names:
                    full = ".".join([*target, alias.name])
                    out.add(full if (PACKAGE / full.replace(".", "/")).with_suffix(".py").exists()
                            or (PACKAGE / full.replace(".", "/")).is_dir() else ".".join(target) or "__init__")
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("alloc_audit"):
                out.add(node.module.removeprefix("alloc_audit").lstrip(".") or "__init__")
            if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit([n for n in inner if isinstance(n, (ast.stmt, ast.excepthandler))], top)  # type: ignore[misc]

    visit(tree.body, True)
    return {m.removesuffix(".__init__") for m in out}


def layer(name: str) -> str | None:
    if name == "cli":
        return "cli"
    if name.startswith("rules._lib"):
        return "rules._lib"
    if name.startswith("rules.") and name not in ("rules.base", "rules.__init__"):
        return "rules.rule"
    for prefix in ("report", "ratchet"):
        if name == prefix or name.startswith(prefix + "."):
            return prefix
    return None


def allowed(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize(("name", "path"), list(modules()), ids=[n for n, _ in modules()])
def test_module_and_class_sizes(name: str, path: Path) -> None:
    lines = source(path).count("\n")
    limit = MAX_CLI_LINES - 1 if name == "cli" else MAX_MODULE_LINES
    assert lines <= limit, f"{path.relative_to(PACKAGE.parent)} has {lines} lines (at most {limit})"
    for node in ast.walk(tree_of(path)):
        if isinstance(node, ast.ClassDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            assert size <= MAX_CLASS_LINES, f"class {node.name} in {path.relative_to(PACKAGE.parent)} has {size} lines"


@pytest.mark.parametrize(("name", "path"), [(n, p) for n, p in modules() if layer(n)],
                         ids=[n for n, _ in modules() if layer(n)])
def test_import_layers(name: str, path: Path) -> None:
    rules = ALLOWED[layer(name) or ""]
    wrong = sorted(t for t in imports(name, path) if not allowed(t, rules) and t not in BASE)
    assert not wrong, f"{path.relative_to(PACKAGE.parent)} imports {wrong}; its layer ({layer(name)}) may import {rules}"


def test_no_import_cycles() -> None:
    """Module-level imports form no cycle (imports inside functions, which
    keep start-up fast, are left out)."""
    graph = {name: {t for t in imports(name, path, top_level_only=True) if t != name} for name, path in modules()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_layer_check_sees_a_wrong_import(tmp_path: Path) -> None:
    """The checker itself: a rule importing another rule is caught."""
    bad = tmp_path / "bad_rule.py"
    bad.write_text("from .snapshot_before_construction import constructed_allocation\nfrom ..model import Site\n")
    found = imports("rules.bad_rule", bad)
    assert "rules.snapshot_before_construction" in found
    assert not allowed("rules.snapshot_before_construction", ALLOWED["rules.rule"])
