"""Stage 5, with the module moves: a move of an empty tensor literal holds
no memory (issue 11, round 19).

``torch.Tensor([]).to(device)``, ``torch.tensor([], dtype=d).cuda()``: a
tensor of no elements moved to the device allocates nothing (the caching
allocator hands out no block for zero bytes), so the move is no site. A
literal with any element, or a tensor named by a variable, stays a site.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Language, Site
from .index import ProjectIndex

_MOVES = frozenset({"Tensor.to", "Tensor.cuda"})
_LITERAL = r"torch\.(?:tensor|Tensor|[A-Z][a-z]*Tensor)"
_EMPTY = re.compile(_LITERAL + r"\(\s*[\[(]\s*[\])]\s*(?:,[^()]*)?\)\.(?:to|cuda)")
_EMPTY_ARGS = re.compile(r"\s*[\[(]\s*[\])]\s*(?:,.*)?", re.S)


def drop_empty_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    return [s for s in sites if not (s.api in _MOVES and s.via is None and s.language is Language.PYTHON
                                     and _empty(s, index))]


def _empty(site: Site, index: ProjectIndex) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    func, move = found
    if _EMPTY.fullmatch(move.callee.replace(" ", "")) is not None:
        return True
    if not move.callee.startswith("(...)."):
        return False
    # a receiver too long to show (`torch.tensor([], dtype=d).cuda()`): the one other call starting there
    inner = [c for c in func.calls if c.span.line == move.span.line and c.span.col == move.span.col and c != move]
    return len(inner) == 1 and re.fullmatch(_LITERAL, inner[0].callee) is not None \
        and _EMPTY_ARGS.fullmatch(inner[0].arglist) is not None
