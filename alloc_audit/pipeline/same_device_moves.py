"""Stage 5, before the callers: a sub-module moved to the device of the
module it belongs to, where every caller hands in a model it has just moved
whole, moves nothing: not a site (issue 11, round 20).

    def warm_up(tower, device):
        device = tower.device
        embed = tower.vision_model.embeddings.patch
        embed = embed.to(device)                        # no site: already there

    self.model = Model(cfg).half().to(self.device)  # in every caller, before the call
    warm_up(self.model.get_tower(), device=self.device)

The move is ``R.to(D)`` (or ``R.to(M.device)``) where every binding of the
local ``R`` before the move is an attribute chain of the parameter ``M``
(``M.a.b``) and every binding of ``D`` is ``M.device``; and every call of
the function (one or more) passes for ``M`` an expression on a name the
caller moved whole to a device earlier in the same function (``self.model =
....to(self.device)``, ``.cuda()``, not a dtype-only ``.to``), with no
rebinding of that name in between. Anything else keeps the site (a model
split across devices is not moved whole by one ``.to``). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site
from .host_params import DEVICE_OF, chain, every_caller_binds, every_caller_passes, keeps_device
from .index import Func, ProjectIndex

_MOVES = frozenset({"Module.to", "Tensor.to"})


def drop_same_device_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[tuple[str, ...], bool] = {}

    def same(site: Site) -> bool:
        if site.api not in _MOVES or site.via is not None or site.language is not Language.PYTHON:
            return False
        found_call = index.site_call(site)
        if found_call is None:
            return False
        func, call = found_call
        if func.scope is None:
            return False
        args = split_args(call.arglist)
        own = _own_device_params(func, call, site.span.line)
        if own is not None:
            if own not in memo:
                memo[own] = every_caller_binds(func, own[1:], index, _same_owner)
            return memo[own]
        if not site.target or not site.target.isidentifier() or len(args) != 1 \
                or args[0].keyword not in (None, "device"):
            return False
        receiver = call.callee.rpartition(".")[0]
        owner = _device_owner(func, args[0].text.strip(), site.span.line)
        if owner is None or owner not in func.scope.params or _member_of(func, receiver, site.span.line) != owner:
            return False
        key = (func.id, owner)
        if key not in memo:
            memo[key] = _callers_moved_whole(func, owner, index)
        return memo[key]

    return [s for s in sites if not same(s)]


def _own_device_params(func: Func, call: Call, line: int) -> tuple[str, str, str] | None:
    """(function id, ``P``, ``D``) for ``P.to(device=D)`` or ``P.data.to(D, dtype)``
    where ``P`` and ``D`` are parameters the function has not rebound before."""
    assert func.scope is not None
    receiver = call.callee.rpartition(".")[0]
    if not call.callee.endswith(".to") or _OWN_RECEIVER.fullmatch(receiver) is None:
        return None
    args = split_args(call.arglist)
    device = next((a for a in args if a.keyword == "device"), None) or \
        next((a for a in args[:1] if a.keyword is None), None)
    param, device_param = receiver.partition(".")[0], device.text.strip() if device is not None else ""
    params = func.scope.params
    if param not in params or device_param not in params or param == device_param \
            or any(a.line < line and (param in a.targets or device_param in a.targets) for a in func.assigns):
        return None
    return func.id, param, device_param


def _same_owner(caller: Func, passed: tuple[str, ...], line: int) -> bool:
    """The caller passes for the device the tensor's own (``t=m.weight, device=m.weight.device``), or a
    parameter of a module and that module's device or its other parameter's (``t=m.bias``,
    ``device=m.device`` / ``m.weight.device``): a state holder's chosen device (``state.device``
    beside ``state.image``) is no tensor's own."""
    tensor, device = passed
    found = _OWN_DEVICE.fullmatch(device)
    if found is None or _OWNED.fullmatch(tensor) is None or tensor.split(".")[0] in ("self", "cls"):
        return False
    held = found.group(1)
    if held == tensor:
        return True  # `weight=m.weight, device=m.weight.device`
    # a module's parameters share its device: `bias=m.bias, device=m.weight.device` or `m.device`
    parent, _, leaf = tensor.rpartition(".")
    return leaf in _PARAMS and (held == parent or held.rpartition(".")[0] == parent
                                and held.rpartition(".")[2] in _PARAMS)


def _device_owner(func: Func, text: str, line: int) -> str | None:
    """``M`` when the device is ``M.device``, directly or through a local every earlier binding of which is it."""
    found = DEVICE_OF.fullmatch(text)
    if found is not None:
        return found.group(1)
    if not text.isidentifier():
        return None
    values = {a.value.strip() for a in func.assigns if a.line < line and text in a.targets}
    if len(values) != 1 or any(a.line < line and text in a.targets and len(a.targets) != 1 for a in func.assigns) \
            or any(c.span.line < line and (c.target or "").strip() == text for c in func.calls):
        return None
    found = DEVICE_OF.fullmatch(values.pop())
    return found.group(1) if found is not None else None


def _member_of(func: Func, receiver: str, line: int) -> str | None:
    """The parameter ``M`` of which the local ``receiver`` is an attribute chain (every earlier binding)."""
    if not receiver.isidentifier():
        return None
    values = {a.value.strip() for a in func.assigns if a.line < line and receiver in a.targets}
    if len(values) != 1 or any(c.span.line < line and (c.target or "").strip() == receiver for c in func.calls):
        return None
    head, dot, rest = values.pop().partition(".")
    return head if dot and re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", rest) else None


def _callers_moved_whole(func: Func, param: str, index: ProjectIndex) -> bool:
    return every_caller_passes(func, param, index, _moved_before)


def _moved_before(caller: Func, passed: str, line: int) -> bool:
    """``passed`` is (an expression on) a name the caller moved whole to a device before ``line``."""
    def on(target: str) -> bool:
        target = target.strip()
        return bool(target) and (passed == target or passed.startswith(target + "."))

    calls = [c for c in caller.calls if c.span.line < line and c.target and on(c.target)]
    assigns = [a for a in caller.assigns if a.line < line and len(a.targets) == 1 and on(a.targets[0])]
    last_call = max(calls, key=lambda c: c.span.line, default=None)
    last_assign = max(assigns, key=lambda a: a.line, default=None)
    if last_assign is not None and (last_call is None or last_assign.line > last_call.span.line):
        # `self.model = (Model(...).half().to(self.device).eval())`: a parenthesised chain, whose
        # outermost call starts on the assignment's line or the next one
        if _MOVE_TEXT.search(last_assign.value) is not None:
            return True
        if not last_assign.value.startswith("("):
            return False
        inner = [c for c in caller.calls if last_assign.line <= c.span.line <= last_assign.line + 1
                 and c.span.end_line < line]
        last_call = max(inner, key=lambda c: (c.span.end_line, c.span.end_col), default=None)
    if last_call is None:
        return False
    return any(c.callee.endswith(".cuda") or c.callee.endswith(".to") and not keeps_device(c)
               for c in chain(caller, last_call))


_OWN_RECEIVER = re.compile(r"[A-Za-z_]\w*(?:\.data)?")
_OWNED = re.compile(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)+")
_OWN_DEVICE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.device")
_PARAMS = frozenset({"weight", "bias"})
_MOVE_TEXT = re.compile(r"\.cuda\(|\.to\(\s*(?!(?:dtype\s*=\s*)?torch\.(?:u?int\d+|float\d*|bfloat16|half|bool|long"
                        r"|int|double|float8\w*)\s*\))")
