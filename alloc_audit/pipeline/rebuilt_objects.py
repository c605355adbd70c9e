"""Stage 5, a question ``built_per_call`` asks of each builder of a class
(round 30, docs/tiers.md §1, §3, §5): does this function make the object
anew in each pass of a loop, or hand it straight to a call, so that it
lives one pass?

Input: a function that constructs the class (``Func``), the class and the
project index. Output: how it does so ("rebuilds it in each pass of a
loop", "hands it straight to a call and drops it"), or "" when any of its
constructions may outlive the pass.

True: ``blen = BatchLenInfo(lens, dev)`` in the body of a decode loop, the
local rebound by the next pass (``kv = (Cache(a) if a else None)`` too);
``logits, _ = model(ids, BatchLenInfo(lens, dev))``, bound nowhere.
False: ``beams.append(Beam(...))`` (a container keeps it),
``setattr(model, name, Probe())`` (a call whose name says it may keep
what it is handed), ``ws = Workspace(n)`` before the loop (kept for the
run), ``[Cache(...) for _ in layers]`` (a comprehension builds a list),
a local returned. Pure.
"""

from __future__ import annotations

import re

from ..model import Call
from .index import ClassInfo, Func, ProjectIndex
from .names import IDENTIFIER, has_name

_CONTAINER_ADDS = frozenset({"append", "extend", "insert", "add", "put", "put_nowait", "setdefault", "update",
                             "appendleft", "push"})
# calls whose result holds their argument: a container add, a container or a partial built of it
_HOLDERS = _CONTAINER_ADDS | {"list", "tuple", "dict", "set", "frozenset", "deque", "partial", "iter", "zip",
                              "enumerate", "map", "sorted", "reversed"}
# calls that may keep what they are handed, by what their names say (`setattr`, `register_hook`, `add_module`,
# `cache_put`): handing an object to one is no evidence that it is dropped
_KEEPING = re.compile(r"_*(?:set|register|add|put|push|append|insert|extend|update|store|cache|save|attach|install"
                      r"|bind|keep|track|enqueue|submit|schedule)", re.IGNORECASE)


def _keeping_call(callee: str) -> bool:
    name = callee.rsplit(".", 1)[-1]
    return name in _HOLDERS or bool(_KEEPING.match(name))


def rebuilt_per_pass(builder: Func, owner: ClassInfo, index: ProjectIndex) -> str:
    """Round 30 (docs/tiers.md §1, §5): every construction of ``owner`` in
    ``builder`` is made anew in a loop body, into a local the next pass
    rebinds or handed straight to a call (``blen = BatchLenInfo(...)`` in a
    decode loop; ``model(ids, BatchLenInfo(...))``), or is handed straight to
    a call and bound nowhere: the object lives one pass (one call), also in a
    run-once ``main``. Not when a construction is added to a container
    (``beams.append(Beam(...))``, ``out.append(b)``), handed to a call whose
    name says it may keep it (``setattr``, ``register_*``, ``add_*``),
    returned, or handed to a project class's constructor (``keeps`` tells
    stores and holders), nor when one is bound to a local outside every loop
    (kept for the run).
    "" when not so."""
    built = [c for c in builder.calls if index.constructed_class(builder, c) is owner]
    if not built:
        return ""
    loops = [b for b in builder.blocks if b.kind == "loop"]
    looped = False
    for call in built:
        line = call.span.line
        in_loop = any(b.span.contains_line(line) for b in loops)
        target = (call.target or "").strip() or _bound_by(builder, call)
        if target:
            if not in_loop or not IDENTIFIER.fullmatch(target):
                return ""
            if any(has_name(r.value, target, not_after=".") for r in builder.returns) or any(
                    c.span.line > line and _keeping_call(c.callee) and has_name(c.arglist, target, not_after="[.")
                    for c in builder.calls):
                return ""
        else:
            # an argument of a call that uses it and returns: the calls around it
            around = [c for c in builder.calls if c is not call and c.span.contains(call.span)]
            if not around or any(_keeping_call(c.callee) or index.constructed_class(builder, c) is not None
                                 or not _locals(c.target) for c in around) or any(r.line == line
                                                                                  for r in builder.returns):
                return ""
        looped = looped or in_loop
    return "rebuilds it in each pass of a loop" if looped else "hands it straight to a call and drops it"


def _locals(target: str | None) -> bool:
    """A call's result bound nowhere or to plain locals (``logits, _ = model(...)``)."""
    return target is None or all(IDENTIFIER.fullmatch(t.strip()) for t in target.strip("()").split(","))


def _bound_by(builder: Func, call: Call) -> str:
    """The plain local an assignment binds the construction to when the facts
    keep no target for it (``kv = (Cache(a) if a else None)``), or ""."""
    text = re.compile(rf"(?<![\w.]){re.escape(call.callee.rsplit('.', 1)[-1])}\(")  # the import may be resolved
    for a in builder.assigns:
        if a.op == "=" and a.line <= call.span.line <= a.line + 3 and text.search(a.value) and len(a.targets) == 1 \
                and IDENTIFIER.fullmatch(a.targets[0].strip()):
            return a.targets[0].strip()
    return ""

