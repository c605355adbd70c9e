"""Stage 5 helper of ``module_classes``: a move's receiver built by a call
to a project function (no class) is a module when that function hands one
back: every value it returns is a single call that builds a module (a
project class deriving from ``nn.Module``, a library layer class), or a
local bound once to such a call (``head = nn.ModuleList()`` ...
``return head``: appending parts keeps it the module it is), or a
call of another project function that does, followed ``depth`` levels
(``build_layer(cfg).to(dev)`` with ``def build_layer(cfg): return
Attention(cfg)``). A function with no returned value, one returning a
tensor expression or a name, or a call the index cannot resolve, is no
module builder. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..model import Call
from .index import Func, ProjectIndex
from .names import IDENTIFIER

# a return value that opens with a call: `Name(` / `pkg.Name(`
_CALL_HEAD = re.compile(r"([A-Za-z_][\w.]*)\s*\(")

Builds = Callable[[Func, Call], bool]
Declared = Callable[[Func, str], bool]


def returns_module(index: ProjectIndex, func: Func, call: Call, builds: Builds, declared: Declared | None = None,
                   depth: int = 2) -> bool:
    """``call`` in ``func`` runs project functions each of whose returned
    values is a call that ``builds`` a module (through ``depth`` levels of
    returned project-function calls), or whose return annotation
    ``declared`` says names a module class (``def get_metric(cfg) ->
    metrics.KLDivergenceMetric``, round 27)."""
    if depth <= 0:
        return False
    targets = index.resolve(func, call)
    if not targets:
        return False
    return all(_hands_back_module(index, target, builds, declared, depth) for target in targets)


def _hands_back_module(index: ProjectIndex, target: Func, builds: Builds, declared: Declared | None,
                       depth: int) -> bool:
    annotation = target.scope.returns_type if target.scope is not None else None
    if declared is not None and annotation and declared(target, annotation):
        return True
    values = [r for r in target.returns if r.value and r.value != "None"]
    if not values or target.table is None:
        return False
    for ret in values:
        value = ret.value.strip()
        bound = IDENTIFIER.fullmatch(value) is not None
        made = _bound_call(target, value) if bound else _returned_call(target, ret.line, value)
        if made is None:
            return False
        if not (builds(target, made) or returns_module(index, target, made, builds, declared, depth - 1)):
            return False
    return True


def _bound_call(target: Func, name: str) -> Call | None:
    """The call a returned local ``name`` holds: its one plain binding in
    ``target`` (``head = nn.ModuleList()`` ... ``head.append(norm)`` ...
    ``return head``) when that binding is the whole value of a call; None
    when the name is bound more than once, by anything else, or is a
    parameter (what a caller handed in)."""
    table = target.table
    if table is None or any(name in a.targets for a in target.assigns):
        return None  # bound to something other than a call's value too
    bound = [table[i] for i in target.call_ix if table.targets[i] == name and "(" not in table.callees[i]]
    return bound[0] if len(bound) == 1 else None


def _returned_call(target: Func, line: int, value: str) -> Call | None:
    """The call that is the whole returned ``value`` on ``line`` (the
    value's text is whitespace-collapsed and capped: compared without
    whitespace, a capped value as a prefix)."""
    m = _CALL_HEAD.match(value)
    table = target.table
    if m is None or table is None:
        return None
    head = m.group(1)
    flat = "".join(value.split())
    pos = table.positions
    for i in target.call_ix:
        if pos[4 * i] != line or "(" in table.callees[i]:
            continue
        whole = "".join(f"{head}({table.arglists[i]})".split())
        if whole.startswith(flat):  # equal, or the value was capped
            return table[i]
    return None
