"""Code that never runs because an unconditional exit comes before it in
the same block: its allocations are not sites.

"The same block" is one statement list (a function body, the body of an
``if``/``elif``/``else``, a loop, a ``with``, a ``try``/``except``/
``finally`` clause, a ``case``): a statement in it that follows a ``raise``,
``return``, ``continue`` or ``break`` written directly in that list never
runs, and neither does anything nested in that statement (a branch, a
loop body, a function it defines). An exit nested one level deeper (in an
``if``, a ``try``, a loop, a nested function) ends only its own list: the
statements after that compound statement still run.

    raise NotImplementedError("not yet")   # the old implementation below is dead
    out = torch.empty(n, device=x.device)  # no site

Part of the Python extractor (``python_sites.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_EXITS = frozenset({"raise_statement", "return_statement", "continue_statement", "break_statement"})
_LISTS = frozenset({"block", "module"})
_NEEDLES = (b"raise", b"return", b"continue", b"break")


class Exits:
    """A file's statement lists: whether the source can hold an exit at all
    (a byte test), and per list, where its first exit ends (-1: none).
    ``parent_of`` is the extractor's ``Ancestry.parent`` (``Node.parent``
    walks down from the root on every call)."""

    def __init__(self, source: bytes, parent_of: Callable[[Any], Any]) -> None:
        self.possible = any(needle in source for needle in _NEEDLES)
        self.first_end: dict[int, int] = {}
        self.parent_of = parent_of


def after_exit(exits: Exits, node: Any) -> bool:
    """Whether ``node`` lies in a statement that follows an unconditional
    exit in its own statement list (see the module text)."""
    if not exits.possible:
        return False
    memo, parent_of = exits.first_end, exits.parent_of
    child = node
    parent = parent_of(node)
    while parent is not None:
        if parent.type in _LISTS:
            end = memo.get(parent.start_byte)
            if end is None:
                first = next((c for c in parent.named_children if c.type in _EXITS), None)
                end = memo[parent.start_byte] = first.end_byte if first is not None else -1
            if 0 <= end <= child.start_byte:
                return True
        child, parent = parent, parent_of(parent)
    return False
