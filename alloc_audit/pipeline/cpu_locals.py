"""Stage 5, before the callers: moves to a local the function binds to the
CPU are not sites (issue 11, round 10).

``device = "cpu"`` and then ``m.to(device)`` (or ``.to(device=device)``)
moves to host memory: no device allocation. Only a local of the function
itself (not a parameter), every assignment of which in the function is the
literal ``"cpu"`` (or ``torch.device("cpu")``); anything else keeps the
site. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Language, Site
from .index import Func, ProjectIndex

_MOVES = frozenset({"Tensor.to", "Module.to"})
_CPU = re.compile(r"""(?:torch\.device\(\s*)?["']cpu["']\s*\)?""")


def drop_cpu_locals(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    return [s for s in sites if not (s.via is None and s.language is Language.PYTHON and s.api in _MOVES
                                     and _to_cpu_local(s, index))]


def _to_cpu_local(site: Site, index: ProjectIndex) -> bool:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None:
        return False
    call = next((c for c in func.calls if c.span == site.span), None)
    if call is None:
        return False
    args = list(split_args(call.arglist))
    named = next((a for a in args if a.keyword == "device"), None)
    arg = named or (args[0] if args and args[0].keyword is None else None)
    name = arg.text.strip() if arg is not None else ""
    return name.isidentifier() and name not in func.scope.params and _only_cpu(func, name)


def _only_cpu(func: Func, name: str) -> bool:
    if any((c.target or "").strip() == name for c in func.calls):  # `device = pick_device()`
        return False
    values = [a.value for a in func.assigns if name in a.targets]
    return bool(values) and all(a.op == "=" and len(a.targets) == 1 for a in func.assigns if name in a.targets) \
        and all(_CPU.fullmatch(v.strip()) for v in values)
