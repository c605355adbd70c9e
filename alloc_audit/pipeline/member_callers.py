"""Stage 5, classify_callers' helper (round 35): per-step callers that call
a method through a member a factory built.

Input: a Python method, its resolved callers, the project index and the
per-step predicate of ``rules/tiers.toml`` ``[callers]``. Output: the
per-step functions that run it. Pure; read from facts the index already
holds (call targets, returns, the calls grouped by name).

A decoder keeps its attention module in a member built by a factory
(``self.attention = init_attn(attn_type, ...)``, a function returning
``OriginalAttention(...)`` or ``GravesAttention(...)``) and calls
``self.attention.init_states(inputs)`` in ``forward``. The call does not
resolve (the member's type is the factory's name), so the initialiser by
name ``init_states`` looked uncalled and kept its T2; its buffers are
rebound on every forward: T4 (docs/tiers.md 5, DESIGN "Lifetime tiers").

- The call counts when it is ``self.<attr>.<name>(...)`` in a per-step
  function, the caller's class (or a base) assigns ``self.<attr>`` from a
  call to a project function that returns a construction of the method's
  class (or of a subclass of it), and the call itself resolves to nothing.
- A method of the same class that the member call reaches through
  ``self.<name>()`` (``init_states`` calling ``self.init_forward_attn``)
  runs on the same step.

Not when the member is built by a construction (the call resolves then and
the ordinary callers answer), nor when no factory return names the class.

``speaking_function`` (round 35) answers the same question for a closure
that classify gave its enclosing function's tier (``new_banks`` nested in
``StaticCache.__init__``, only the constructor calls it): its callers are
that function's, so an object built per ``generate`` makes the closure's
buffers per call too (docs/tiers.md 1 and 3), as it does the constructor's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..model import Language, Site
from .index import ClassInfo, Func, ProjectIndex

_CLOSURE = re.compile(r" is a closure only (\S+) calls: it runs when that runs")  # classify_sites' reason
_MEMBER_CALL = re.compile(r"^self\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)$")
_HEAD = re.compile(r"^([A-Za-z_][\w.]*)\s*\(")


def speaking_function(site: Site) -> str:
    """The scope whose callers decide for ``site``: the enclosing function
    classify named for a closure only it calls, else the site's own."""
    m = _CLOSURE.search(site.tier_reason)
    return m.group(1) if m is not None and site.scope.startswith(f"{m.group(1)}.") else site.scope


def member_callers(func: Func, callers: Sequence[Func], index: ProjectIndex,
                   per_step: Callable[[str], bool]) -> Func | None:
    """Per-step functions calling ``func`` (or a same-class method calling it) through a factory-built member."""
    owner = func.owner
    if owner is None or func.language is not Language.PYTHON:
        return None
    for target in (func, *(c for c in callers if c.owner is owner and c is not func)):
        found = _through_member(target, owner, index, per_step)
        if found is not None:
            return found
    return None


def _through_member(target: Func, owner: ClassInfo, index: ProjectIndex,
                    per_step: Callable[[str], bool]) -> Func | None:
    for caller, i in index.calls_named(target.name):
        if caller.table is None or caller.owner is None or not per_step(caller.name):
            continue
        callee = caller.table.callees[i]
        m = _MEMBER_CALL.match(callee)
        if m is None or m.group(2) != target.name or index.resolve(caller, callee):
            continue
        if _built_by_factory(caller.owner, m.group(1), owner, index):
            return caller
    return None


def _built_by_factory(cls: ClassInfo, attr: str, made: ClassInfo, index: ProjectIndex) -> bool:
    """``cls`` (or a base) assigns ``self.<attr>`` from a project function returning a ``made``."""
    target = f"self.{attr}"
    for owner in (cls, *index.base_classes(cls)):
        for methods in owner.methods.values():
            for method in methods:
                table = method.table
                if table is None:
                    continue
                for i in method.call_ix:  # `self.attention = init_attn(...)` is the call's target
                    if table.targets[i] != target:
                        continue
                    for factory in index.resolve(method, table.callees[i]):
                        if factory.scope is not None and factory.scope.role != "constructor" \
                                and _returns(factory, made, index):
                            return True
    return False


def _returns(factory: Func, made: ClassInfo, index: ProjectIndex) -> bool:
    for ret in factory.returns:
        head = _HEAD.match(ret.value.strip())
        if head is None:
            continue
        cls = index.class_named(factory, head.group(1))
        if cls is not None and (cls is made or made in index.base_classes(cls)):
            return True
    return False
