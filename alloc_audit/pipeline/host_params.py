"""Stage 5, before the callers: a move to the device of a module's weight
where every caller hands in a module it has just moved to the CPU is a
host copy, not a device site (issue 11, round 20).

    def from_linear(cls, linear, scale):
        weight = linear.weight.data
        weight = weight.div_(scale.to(weight.device))   # no site: weight is on the CPU

    module = module.cpu()            # in the only caller, just before the call
    q = Quantized.from_linear(module, scale)

The move's device is ``NAME.device`` where every binding of the local
``NAME`` before the move is the weight of a parameter (``P.weight``,
``P.weight.data``) or a method chain on ``NAME`` or that weight that keeps
the device (not ``.cuda()``, not a ``.to`` other than to a dtype); and
every call of the function (one or more, all resolved) passes for ``P`` a
name whose last binding before the call, in the caller, is a literal CPU
move of it (``m = m.cpu()``, ``m = m.to("cpu")``). A caller that passes
anything else, a move to another device, a rebinding between the move and
the call, or a binding of ``NAME`` the rule cannot read keeps the site. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..arglists import argument_for, split_args
from ..model import Arg, Call, Language, Site
from .index import Func, ProjectIndex

DEVICE_OF = re.compile(r"([A-Za-z_]\w*)\.device")
_WEIGHT = re.compile(r"([A-Za-z_]\w*)\.weight(?:\.data)?")
_DTYPE = re.compile(r"(?:dtype\s*=\s*)?torch\.(?:u?int\d+|float\d*|bfloat16|half|bool|long|int|double|float8\w*)")
_CPU = re.compile(r"""(?:device\s*=\s*)?(?:torch\.device\(\s*)?["']cpu["']\s*\)?""")
_CHANGES_DEVICE = frozenset({"cuda", "to", "npu", "xpu"})
_SELF = frozenset({"self", "cls"})


def drop_host_param_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[tuple[str, str], bool] = {}

    def host(site: Site) -> bool:
        if site.api != "Tensor.to" or site.via is not None or site.language is not Language.PYTHON \
                or site.device not in (None, "unknown"):
            return False
        found_call = index.site_call(site)
        if found_call is None:
            return False
        func, call = found_call
        if func.scope is None:
            return False
        args = split_args(call.arglist)
        default = _cpu_default_param(func, args)
        if default is not None:
            key = (func.id, "=" + default)
            if key not in memo:
                memo[key] = _callers_leave_default(func, default, index)
            return memo[key]
        device = next((a for a in args if a.keyword == "device"), None) or \
            next((a for a in args if a.keyword is None and DEVICE_OF.fullmatch(a.text.strip())), None)
        found = DEVICE_OF.fullmatch(device.text.strip()) if device is not None else None
        if found is None:
            return False
        param = _weight_param(func, found.group(1), site.span.line)
        if param is None:
            return False
        key = (func.id, param)
        if key not in memo:
            memo[key] = _callers_pass_cpu(func, param, index)
        return memo[key]

    return [s for s in sites if not host(s)]


def _cpu_default_param(func: Func, args: Sequence[Arg]) -> str | None:
    """The parameter the move's device is, when its default is the CPU
    (`def state_dict(self, name, device="cpu")` ... `t.to(device)`) and the
    function never rebinds it."""
    assert func.scope is not None
    texts = [a.text.strip() for a in args if a.keyword in (None, "device")]
    if len(texts) != 1 or not texts[0].isidentifier() or texts[0] not in func.scope.params:
        return None
    name = texts[0]
    defaults = func.scope.param_defaults
    position = func.scope.params.index(name)
    if position >= len(defaults) or not _CPU.fullmatch(defaults[position].strip()):
        return None
    if any(name in a.targets for a in func.assigns) or any((c.target or "").strip() == name for c in func.calls):
        return None
    return name


def _callers_leave_default(func: Func, param: str, index: ProjectIndex) -> bool:
    """``func`` has callers besides itself, and every one leaves ``param``
    to its CPU default or (a recursive call) hands on ``func``'s own. A
    call by ``func``'s name that the call graph does not resolve
    (``result.scale.state_dict(name)``) may be one: it must leave it too."""
    assert func.scope is not None
    params = list(func.scope.params)
    position = params.index(param) - (1 if params and params[0] in _SELF else 0)
    outside = False
    for caller, call, _ in index.calls_reaching(func):
        args = split_args(call.arglist)
        if any(a.text.lstrip().startswith("*") for a in args):
            return False  # `f(*args)`, `f(**kw)`: what it passes is not known
        passed = argument_for(args, param, position)
        if passed is not None and not (caller is func and passed.text.strip() == param):
            return False
        outside = outside or caller is not func
    return outside


def chain(func: Func, call: Call) -> list[Call]:
    """The calls of a method chain that ends in ``call`` (they start where it starts), innermost first."""
    start = (call.span.line, call.span.col)
    return sorted((c for c in func.calls if (c.span.line, c.span.col) == start),
                  key=lambda c: (c.span.end_line, c.span.end_col))


def keeps_device(call: Call) -> bool:
    method = call.callee.rsplit(".", 1)[-1]
    if method not in _CHANGES_DEVICE:
        return True
    args = split_args(call.arglist)
    return method == "to" and len(args) == 1 and bool(_DTYPE.fullmatch(args[0].text.strip()))


def _weight_param(func: Func, name: str, line: int) -> str | None:
    """The parameter whose weight every binding of ``name`` before ``line`` holds, if any."""
    assert func.scope is not None
    params = set(func.scope.params)
    found: set[str] = set()
    for assign in func.assigns:
        if assign.line >= line or name not in assign.targets:
            continue
        weight = _WEIGHT.fullmatch(assign.value.strip())
        if len(assign.targets) != 1 or assign.op != "=" or weight is None or weight.group(1) not in params:
            return None
        found.add(weight.group(1))
    for call in func.calls:
        if call.span.line >= line or (call.target or "").strip() != name:
            continue
        links = chain(func, call)
        root = links[0].callee.rpartition(".")[0] if links else ""
        weight = _WEIGHT.fullmatch(root)
        if not all(keeps_device(c) for c in links) or not (root == name or weight and weight.group(1) in params):
            return None
        if weight is not None:
            found.add(weight.group(1))
    return found.pop() if len(found) == 1 else None


def _callers_pass_cpu(func: Func, param: str, index: ProjectIndex) -> bool:
    return every_caller_passes(func, param, index, _moved_to_cpu)


def every_caller_passes(func: Func, param: str, index: ProjectIndex,
                        test: Callable[[Func, str, int], bool]) -> bool:
    """``func`` has callers, and every one hands ``param`` an argument for which
    ``test(caller, argument text, call line)`` holds."""
    return every_caller_binds(func, (param,), index, lambda caller, passed, line: test(caller, passed[0], line))


def every_caller_binds(func: Func, names: Sequence[str], index: ProjectIndex,
                       test: Callable[[Func, tuple[str, ...], int], bool]) -> bool:
    """``func`` has callers, and every one hands each of the parameters
    ``names`` an argument, the texts of which, in that order, pass
    ``test(caller, texts, call line)``."""
    assert func.scope is not None
    params = list(func.scope.params)
    offset = 1 if params and params[0] in _SELF else 0
    seen = False
    for caller, call in calls_of(func, index):
        args = split_args(call.arglist)
        texts = []
        for name in names:
            passed = argument_for(args, name, params.index(name) - offset)
            if passed is None:
                return False
            texts.append(passed.text.strip())
        if not test(caller, tuple(texts), call.span.line):
            return False
        seen = True
    return seen


def calls_of(func: Func, index: ProjectIndex) -> list[tuple[Func, Call]]:
    """The calls that resolve to ``func`` (a constructor: the constructions
    of its class), and those of a method that name its class
    (``Quantized.from_linear(...)`` through a package's star re-export,
    which the call graph does not follow)."""
    owner = func.owner.name if func.owner is not None else None
    out = []
    named = list(index.calls_named(func.name))
    if func.name == "__init__" and owner is not None:
        named += index.calls_named(owner)
    for caller, i in named:
        if caller.table is None:
            continue
        call = caller.call_at(i)
        resolved = index.resolve(caller, call)
        if func in resolved or not resolved and owner is not None \
                and call.callee.rpartition(".")[0].rpartition(".")[2] == owner:
            out.append((caller, call))
    return out


def _moved_to_cpu(caller: Func, name: str, line: int) -> bool:
    """The last binding of ``name`` before ``line`` in ``caller`` is ``name = name.cpu()`` or ``.to("cpu")``."""
    if not name.isidentifier():
        return False
    moves = [c for c in caller.calls if c.span.line < line and (c.target or "").strip() == name]
    last = max(moves, key=lambda c: c.span.line, default=None)
    if last is None or any(last.span.line < a.line < line and name in a.targets for a in caller.assigns):
        return False
    if last.callee == f"{name}.cpu" and not last.arglist.strip():
        return True
    args = split_args(last.arglist)
    return last.callee == f"{name}.to" and len(args) == 1 and bool(_CPU.fullmatch(args[0].text.strip()))
