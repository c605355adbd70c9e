"""Code that never runs because an unconditional exit comes before it in
the same block: its allocations are not sites (Python and C++).

"The same block" is one statement list: in Python a function body, the
body of an ``if``/``elif``/``else``, a loop, a ``with``, a ``try``/
``except``/``finally`` clause, a ``case``; in C++ a compound statement
(``{ ... }``). A statement in it that follows a ``raise``/``throw``,
``return``, ``continue``, ``break`` (or ``goto``) written directly in that
list never runs, and neither does anything nested in that statement (a
branch, a loop body, a function it defines). An exit nested one level
deeper (in an ``if``, a ``try``, a loop, a nested function or lambda) ends
only its own list: the statements after that compound statement still run.
In C++ a label, a ``case`` or a preprocessor line between the exit and the
statement makes it reachable again (a ``goto``, another configuration);
a list the parser had to recover from an error is never judged.

    raise NotImplementedError("not yet")   # the old implementation below is dead
    out = torch.empty(n, device=x.device)  # no site

Part of the extractors (``python_sites.py``, ``cpp_sites.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_PY_EXITS = frozenset({"raise_statement", "return_statement", "continue_statement", "break_statement"})
_PY_LISTS = frozenset({"block", "module"})
_PY_NEEDLES = (b"raise", b"return", b"continue", b"break")
_CPP_EXITS = frozenset({"throw_statement", "return_statement", "continue_statement", "break_statement",
                        "goto_statement"})
_CPP_LISTS = frozenset({"compound_statement"})
_CPP_NEEDLES = (b"throw", b"return", b"continue", b"break", b"goto")
_CPP_RESETS = ("labeled_statement", "case_statement", "preproc")


class Exits:
    """A file's statement lists: whether the source can hold an exit at all
    (a byte test), and per list, where its first exit ends (-1: none) and
    where the statements that make code reachable again start.
    ``ancestors_of`` is the extractor's ``Ancestry.ancestors`` (``Node.parent``
    walks down from the root on every call; the ancestry reads a node's
    whole chain of parents off the path it keeps, in one step)."""

    def __init__(self, source: bytes, ancestors_of: Callable[[Any], list[Any]], cpp: bool = False) -> None:
        self.possible = any(needle in source for needle in (_CPP_NEEDLES if cpp else _PY_NEEDLES))
        self.ancestors_of = ancestors_of
        self.lists = _CPP_LISTS if cpp else _PY_LISTS
        self.exits = _CPP_EXITS if cpp else _PY_EXITS
        self.resets: tuple[str, ...] = _CPP_RESETS if cpp else ()
        self.first: dict[int, tuple[int, tuple[int, ...]]] = {}

    def of(self, block: Any) -> tuple[int, tuple[int, ...]]:
        found = self.first.get(block.start_byte)
        if found is None:
            end, resets = -1, []
            if not block.has_error:
                for child in block.named_children:
                    if end < 0 and child.type in self.exits:
                        end = child.end_byte
                    elif end >= 0 and self.resets and child.type.startswith(self.resets):
                        resets.append(child.start_byte)
            found = self.first[block.start_byte] = (end, tuple(resets))
        return found


def after_exit(exits: Exits, node: Any) -> bool:
    """Whether ``node`` lies in a statement that follows an unconditional
    exit in its own statement list (see the module text)."""
    if not exits.possible:
        return False
    child = node
    for parent in exits.ancestors_of(node):
        if parent.type in exits.lists:
            end, resets = exits.of(parent)
            if 0 <= end <= child.start_byte and not any(end <= r <= child.start_byte for r in resets):
                return True
        child = parent
    return False
