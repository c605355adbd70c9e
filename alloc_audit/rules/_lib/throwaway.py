"""What makes a capture a throwaway (a profiling or estimating capture whose
graphs are destroyed before the function returns): shared by
throwaway-graph-pool and capture-without-rollback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...globs import matcher
from ...model import Span
from ...pipeline.index import Func

if TYPE_CHECKING:
    from ...pack import RulePack


def throwaway_evidence(func: Func, pack: RulePack) -> tuple[str, int] | None:
    """(what shows the graphs are thrown away, line), or None."""
    is_destroyer = matcher(pack.graph_destroyers)
    for call in sorted(func.calls, key=lambda c: c.span.line):
        if is_destroyer(call.callee):
            return f"{call.callee} destroys the graphs", call.span.line
    for assign in func.assigns:
        if assign.op == "del" and any("graph" in t.lower() or "wrapper" in t.lower() for t in assign.targets):
            return f"del {', '.join(assign.targets)}", assign.line
    scope = func.scope
    if scope is None:
        return None
    is_throwaway = matcher(pack.throwaway_names)
    if is_throwaway(scope.name) or is_throwaway(scope.name.lower()):
        return f"{scope.name} is a throwaway capture by its name", scope.span.line
    doc = scope.doc.lower()
    if any(word in doc for word in ("profile", "profiling", "estimate", "measure", "dry run", "throw")):
        return f"{scope.name} is a throwaway capture by its docstring", scope.span.line
    return None


def inside_finally(func: Func, span: Span) -> bool:
    return any(b.kind == "finally" and b.span.line <= span.line <= b.span.end_line for b in func.blocks)
