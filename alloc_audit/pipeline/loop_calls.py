"""Whether a caller calls a function inside a loop (used by the run-once
chains of ``classify_callers``): ``main`` runs once, but what it calls in
``for epoch in range(n): train(...)`` runs once per pass (DESIGN.md,
"Lifetime tiers": per epoch is per call, not per process)."""

from __future__ import annotations

import re

from .index import Func

# a script's entry point by name (`main`, `_main`, `cli_main`), for the passes that read one
ENTRY_NAME = re.compile(r"_?main|\w+_main")


def calls_in_loop(caller: Func, callee: Func) -> bool:
    """Every call of ``callee`` by name in ``caller`` sits in a loop body."""
    calls = caller.calls_of(callee.name)
    return bool(calls) and all(caller.in_loop(c.span.line) for c in calls)


def script_entry(func: Func, callers: list[Func]) -> bool:
    """``func``, named like a step (``generate``), is called only by
    module-level code and never in a loop there (a script's ``if __name__ ==
    "__main__": generate(args)``): it runs once per process, whatever its
    name says (the code wins over the name)."""
    return bool(callers) and all(
        c.qualname == "<module>" and not any(c.in_loop(call.span.line) for call in c.calls_of(func.name))
        for c in callers)
