"""Stage 5, classify (round 32): a nested function that only the function
it is defined in calls runs when that function runs, so the enclosing
function's name, not the closure's, says how often its allocations are made.

Input: one file's facts and a scope's qualified name. Output: the qualified
name of the function whose name should speak for the scope (the scope
itself, or the outermost enclosing function reached through closures that
never escape).

The tier patterns read the innermost function's name (``init*`` is an
initialiser, T2). A closure defined in a per-call method and called only
there re-runs with every call of it:

    def update_kv(self, k, q, v):              # per call
        def init_metadata(lens):               # a name, not a lifetime
            self.head_lens = torch.tensor(lens, device=d)
        init_metadata([q.shape[-2]] * h)

``init_metadata``'s tensor is made per call of ``update_kv``: the patterns
read ``update_kv``. A closure that escapes keeps its own name: one the
function returns, hands to a call (``run(step)``, ``register_hook(fn)``),
binds to another name or decorates, and one a sibling closure calls, may
run at any time. Decided from the one file's facts (a nested function is
visible only in the function that defines it)."""

from __future__ import annotations

from ..model import FileFacts, Scope
from .names import has_name


def speaking_scope(qualname: str, facts: FileFacts, scopes: dict[str, Scope]) -> str:
    """The scope whose name the tier patterns should read for ``qualname``."""
    current = qualname
    while True:
        own = scopes.get(current)
        if own is None or own.kind != "function" or own.role == "lambda" or own.decorators:
            return current
        parent_q, _, name = current.rpartition(".")
        parent = scopes.get(parent_q)
        if not parent_q or parent is None or parent.kind != "function" or parent.role == "lambda" \
                or not _private(name, parent_q, current, facts):
            return current
        current = parent_q


def _private(name: str, parent: str, own: str, facts: FileFacts) -> bool:
    """``name`` (the closure ``own`` defined in ``parent``) is only called
    directly, and only by ``parent`` itself (or by the closure): never
    handed on, bound, returned, nor called by a sibling closure."""
    inside = (parent, f"{parent}.")
    called = False
    table = facts.calls  # read by column: no ``Call`` built per call of the file (round 33, issue 15)
    for scope, callee, arglist in zip(table.scopes, table.callees, table.arglists):
        if not scope.startswith(inside) and scope != parent:
            continue
        if callee == name:
            if scope not in (parent, own) and not scope.startswith(f"{own}."):
                return False  # a sibling closure calls it: as often as that one runs
            called = called or scope == parent
        elif callee.startswith(f"{name}."):
            return False  # `fn.register(...)`, `fn.__get__(...)`: an object, not a call
        if has_name(arglist, name, not_before=".", not_after="("):
            return False  # handed on: the receiver decides when it runs
    for assign in facts.assigns:
        if (assign.scope == parent or assign.scope.startswith(inside[1])) \
                and has_name(assign.value, name, not_before=".", not_after="("):
            return False
    for ret in facts.returns:
        if (ret.scope == parent or ret.scope.startswith(inside[1])) \
                and has_name(ret.value, name, not_before=".", not_after="("):
            return False
    return called
