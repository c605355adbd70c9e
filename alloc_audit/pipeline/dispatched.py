"""Functions run through a dispatch table a decorator fills (issue 11).

``@register_backend("sdpa")`` over ``def _sdpa_call(...)``, where the
decorator (or the function it returns) stores its function argument in a
module-level table (``BACKENDS[kind] = func``), makes ``_sdpa_call`` an
implementation no call names: the function that reads the table
(``BACKENDS.get(kind)``) hands it to its callers, which call it. So the
implementation runs as often as the reader's callers do: a per-step
function that reaches the reader (``forward`` -> ``_get_backend``) runs it
per step, and what it calls is reached from that function.

``per_step_reader`` answers that for ``classify_callers``: a per-step
function reaching the reader of a table that one of ``funcs`` is
registered in. Cost: the decorators of the functions asked about (a resolve
each), the decorator's own assignments, and the index's calls named
``get`` (one table lookup), memoised per registry name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..model import Language
from .index import Func, ProjectIndex

Pred = Callable[[str], bool]
_READER_DEPTH = 2  # calls up from a table's reader to the per-step function that calls what it hands out


def _tables(func: Func, index: ProjectIndex) -> list[str]:
    """The module-level tables ``func``'s decorators store it in."""
    scope = func.scope
    if scope is None or not scope.decorators or func.language is not Language.PYTHON:
        return []
    found: list[str] = []
    for deco in scope.decorators:
        for target in index.resolve(func, deco):
            prefix = target.qualname + "."
            for inner in index.functions_in(target.path):
                if inner is not target and not inner.qualname.startswith(prefix):
                    continue
                params = inner.scope.params if inner.scope is not None else ()
                for assign in inner.assigns:
                    if assign.op != "=" or assign.value not in params:
                        continue
                    for text in assign.targets:
                        table, bracket, _ = text.partition("[")
                        if bracket and table.isidentifier():
                            found.append(table)
    return found


def _readers(table: str, index: ProjectIndex, memo: dict[str, list[Func]]) -> list[Func]:
    """Functions that read ``table`` by ``table.get(...)``."""
    key = f"table:{table}"
    found = memo.get(key)
    if found is None:
        suffix = table + ".get"
        found = memo[key] = sorted(
            {f.id: f for f, ix in index.calls_named("get")
             if f.table is not None and (f.table.callees[ix] == suffix
                                         or f.table.callees[ix].endswith("." + suffix))}.values(),
            key=lambda f: f.id)
    return found


def per_step_reader(funcs: Iterable[Func], index: ProjectIndex, per_step: Pred,
                    memo: dict[str, list[Func]]) -> Func | None:
    """A per-step function that reaches (up to ``_READER_DEPTH`` calls up)
    the reader of a dispatch table one of ``funcs`` is registered in."""
    for func in funcs:
        for table in _tables(func, index):
            for reader in _readers(table, index, memo):
                dist = index.callers_within([reader], _READER_DEPTH)
                for fid in sorted(dist, key=lambda f: (dist[f], f)):
                    caller = index.funcs.get(fid)
                    if caller is not None and per_step(caller.name):
                        return caller
    return None
