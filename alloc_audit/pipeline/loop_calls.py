"""Whether a caller calls a function inside a loop (used by the run-once
chains of ``classify_callers``): ``main`` runs once, but what it calls in
``for epoch in range(n): train(...)`` runs once per pass (DESIGN.md,
"Lifetime tiers": per epoch is per call, not per process)."""

from __future__ import annotations

from .index import Func


def calls_in_loop(caller: Func, callee: Func) -> bool:
    """Every call of ``callee`` by name in ``caller`` sits in a loop body."""
    calls = caller.calls_of(callee.name)
    return bool(calls) and all(caller.in_loop(c.span.line) for c in calls)
