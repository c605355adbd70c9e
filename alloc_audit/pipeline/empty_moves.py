"""Stage 5, with the module moves: a move of an empty tensor literal holds
no memory (issue 11, round 19).

``torch.Tensor([]).to(device)``, ``torch.tensor([], dtype=d).cuda()``: a
tensor of no elements moved to the device allocates nothing (the caching
allocator hands out no block for zero bytes), so the move is no site. A
literal with any element, or a tensor named by a variable, stays a site.
Round 25: so is a constructor given nothing (``torch.LongTensor().to(d)``),
and a module-level name bound once, at module level, to a shaped factory
with a literal 0 dimension and bound nowhere else in the file
(``_null = torch.empty([0])``, then ``_null.to(x.device)``). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Site
from .extract.common import zero_element_receiver
from .index import Func, ProjectIndex
from .move_apis import TENSOR_MOVES, without_moves

_LITERAL = r"torch\.(?:tensor|Tensor|[A-Z][a-z]*Tensor)"
_EMPTY = re.compile(_LITERAL + r"\((?:\s*[\[(]\s*[\])]\s*(?:,[^()]*)?)?\)\.(?:to|cuda)")
_NAMED = re.compile(r"([A-Za-z_]\w*)\.(?:to|cuda)")
_EMPTY_ARGS = re.compile(r"\s*[\[(]\s*[\])]\s*(?:,.*)?", re.S)


def drop_empty_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    return without_moves(sites, TENSOR_MOVES, lambda s: _empty(s, index))


def _empty(site: Site, index: ProjectIndex) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    func, move = found
    if _EMPTY.fullmatch(move.callee.replace(" ", "")) is not None:
        return True
    named = _NAMED.fullmatch(move.callee.replace(" ", ""))
    if named is not None:
        return _empty_global(named.group(1), func, index)
    if not move.callee.startswith("(...)."):
        return False
    # a receiver too long to show (`torch.tensor([], dtype=d).cuda()`): the one other call starting there
    inner = [c for c in func.calls if c.span.line == move.span.line and c.span.col == move.span.col and c != move]
    return len(inner) == 1 and re.fullmatch(_LITERAL, inner[0].callee) is not None \
        and _EMPTY_ARGS.fullmatch(inner[0].arglist) is not None


def _empty_global(name: str, func: Func, index: ProjectIndex) -> bool:
    """``name`` is no local of ``func`` and the file binds it once, at module
    level, to a factory of no elements (``_null = torch.empty([0])``)."""
    if (func.scope is not None and name in func.scope.params) or _binds(func, name):
        return False
    module = index.func(func.path, "<module>")
    if module is None:
        return False
    made = [c for c in module.calls if (c.target or "").strip() == name]
    if len(made) != 1 or any(name in a.targets for a in module.assigns):
        return False
    if any(_binds(f, name) for f in index.functions_in(func.path) if f is not module):
        return False  # rebound in a function (`global name`)
    return zero_element_receiver(f"{made[0].callee}({made[0].arglist})")


def _binds(func: Func, name: str) -> bool:
    return any((c.target or "").strip() == name for c in func.calls) or \
        any(name in a.targets or any(t.strip() == name for t in a.targets) for a in func.assigns)
