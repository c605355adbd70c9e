"""What a local is bound to: the value text of the last assignment to a
name before a line, also through a tuple assignment (``grad, state =
p.grad, self.state[p]``; a starred item on the right, ``a, b, c = x,
*pair``, is aligned from the end for the names after it). Pure.
"""

from __future__ import annotations

from ..arglists import split_top_level
from .index import Func


def bound_value(func: Func, name: str, line: int) -> str:
    """The value ``func`` binds to ``name`` last before ``line``; empty when
    none is told."""
    found = ""
    for a in func.assigns:
        if a.line >= line or a.op != "=" or name not in a.targets:
            continue
        if a.targets == (name,):
            found = a.value.strip()
            continue
        items = [item.strip() for item in split_top_level(a.value)]
        at = a.targets.index(name)
        stars = [i for i, item in enumerate(items) if item.startswith("*")]
        if not stars and len(items) == len(a.targets):
            found = items[at]
        elif len(stars) == 1 and (at < stars[0] or at >= len(a.targets) - (len(items) - stars[0] - 1)):
            found = items[at] if at < stars[0] else items[len(items) - (len(a.targets) - at)]
        else:
            found = ""
    return found
