"""The catalogue's move APIs (``rules/apis``: ``.to``/``.cuda`` of a tensor
or a module), named once for the passes that ask "is this site a move?".
Each pass picks the set its rule is about: a pass proving a tensor copy
needs nothing, one about a module's weights, ``.to`` alone (the one move
that may carry a ``device=`` a pass reads), or any move."""

from __future__ import annotations

TENSOR_MOVES = frozenset({"Tensor.to", "Tensor.cuda"})
MODULE_MOVES = frozenset({"Module.to", "Module.cuda"})
TO_MOVES = frozenset({"Tensor.to", "Module.to"})
MOVES = TENSOR_MOVES | MODULE_MOVES
