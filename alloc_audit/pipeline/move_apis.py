"""The catalogue's move APIs (``rules/apis``: ``.to``/``.cuda`` of a tensor
or a module), named once for the passes that ask "is this site a move?".
Each pass picks the set its rule is about: a pass proving a tensor copy
needs nothing, one about a module's weights, ``.to`` alone (the one move
that may carry a ``device=`` a pass reads), or any move. ``without_moves`` is the one place a pass drops the direct
Python moves it proves copy nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..model import Language, Site

TENSOR_MOVES = frozenset({"Tensor.to", "Tensor.cuda"})
MODULE_MOVES = frozenset({"Module.to", "Module.cuda"})
TO_MOVES = frozenset({"Tensor.to", "Module.to"})
MOVES = TENSOR_MOVES | MODULE_MOVES


def without_moves(sites: Sequence[Site], apis: frozenset[str], moves_nothing: Callable[[Site], bool]) -> list[Site]:
    """The sites, less each direct (not derived) Python site whose API is
    in ``apis`` and that ``moves_nothing`` proves copies nothing; the order
    is kept, and ``moves_nothing`` is asked only of such sites."""
    return [s for s in sites if not (s.api in apis and s.via is None and s.language is Language.PYTHON
                                     and moves_nothing(s))]
