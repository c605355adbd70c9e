"""Stage 5, before the callers: allocations on a device the function binds
to the CPU are not sites (issue 11, rounds 10 and 16).

``device = "cpu"`` (or ``torch.device("cpu")``) and then ``m.to(device)``,
``.to(device=device)`` or a factory's ``device=device`` allocates host
memory: no device allocation. The name is either a local of the function
itself, every binding of which in the function is that literal, or a
parameter of a test the function's own ``pytest.mark.parametrize`` decorator
gives only CPU values (``@parametrize("device", [torch.device("cpu")])``,
or that position of every tuple of a several-name one, round 19) and the
body never rebinds. Anything else keeps the site: a binding to
anything else, a parametrize list with any other value (or ``indirect``),
a parameter with only a CPU default (callers may pass a GPU). A parameter
of a nested function that every call in its enclosing function binds to
the CPU, the function never handed on as a value, is the CPU too (round
19: ``move_tensor(param, "cpu")``). Pure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site
from .index import Func, ProjectIndex
from .index.values import bind_edge, off_device
from .move_apis import TO_MOVES

_CUT = 390  # the extractor keeps the first 400 bytes of an argument list
_CPU = re.compile(r"""(?:torch\.device\(\s*)?["']cpu["']\s*\)?""")


def drop_cpu_locals(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    host = _HostDevices(index)
    return [s for s in sites if not (s.via is None and s.language is Language.PYTHON and host.on_cpu(s))]


class _HostDevices:
    """Which sites allocate on a device name the function binds to the CPU."""

    def __init__(self, index: ProjectIndex) -> None:
        self.index = index
        self.parametrize = Parametrize(index)

    def on_cpu(self, site: Site) -> bool:
        if site.device not in (None, "unknown"):
            return False  # a device said literally
        found_call = self.index.site_call(site)
        if found_call is None:
            return False
        func, call = found_call
        if func.scope is None:
            return False
        if "device" not in call.arglist and site.api not in TO_MOVES:
            return False
        args = list(split_args(call.arglist))
        named = next((a for a in args if a.keyword == "device"), None)
        if named is None and site.api in TO_MOVES:
            named = args[0] if args and args[0].keyword is None else None
        name = named.text.strip() if named is not None else ""
        if not name.isidentifier():
            return False
        if name not in func.scope.params:
            return _only_cpu(func, name) or self._constant_cpu(func, name)
        return not _bound(func, name) and (self._parametrized_cpu(func, name) or self._callers_cpu(func, name))

    def _constant_cpu(self, func: Func, name: str) -> bool:
        """``name`` is a module constant bound to the CPU that the function
        never binds (`CPU = torch.device("cpu")`, here or imported by name:
        `from .device import CPU` ... `torch.empty(n, device=CPU)`)."""
        parts = func.qualname.split(".")
        for i in range(len(parts), 0, -1):  # nor does any function it is nested in (a closure's name)
            outer = func if i == len(parts) else self.index.func(func.path, ".".join(parts[:i]))
            if outer is not None and _bound(outer, name):
                return False
        return off_device(self.index.visible_constants(func.path).get(name))

    def _callers_cpu(self, func: Func, name: str) -> bool:
        """``func`` is a function nested in another, every call of which
        binds parameter ``name`` to the CPU (`move_tensor(p, "cpu")`), and
        that its enclosing function never hands on as a value (a callback's
        calls are not seen; nor is a name that may be imported elsewhere,
        so module-level functions are left out)."""
        if "." not in func.qualname or func.owner is not None or func.scope is None \
                or func.scope.role != "function":
            return False
        index = self.index
        outer = index.func(func.path, func.qualname.rsplit(".", 1)[0])
        if outer is None or outer.scope is None or outer.scope.role not in ("function", "method"):
            return False
        mention = re.compile(rf"\b{re.escape(func.name)}\b(?!\s*\()")
        inner = [f for f in index.functions_in(func.path) if f.qualname.startswith(outer.qualname + ".")]
        for f in (outer, *inner):
            if any(mention.search(c.arglist) or len(c.arglist) >= _CUT for c in f.calls) \
                    or any(mention.search(a.value) for a in f.assigns):
                return False  # handed on (`map(move_tensor, ...)`), or an argument list cut short
        found = False
        for caller in (outer, *inner):
            for call in caller.calls:
                if call.callee != func.name:
                    continue
                env = bind_edge(caller, call, func, {}, index.visible_constants(caller.path))
                if not off_device(env.get(name)):
                    return False
                found = True
        return found

    def _parametrized_cpu(self, func: Func, name: str) -> bool:
        """``func``'s own ``parametrize`` decorators give ``name`` only CPU values."""
        if func.scope is None or not any(d.rsplit(".", 1)[-1] == "parametrize" for d in func.scope.decorators):
            return False
        lists = self.parametrize.arglists(func)
        verdicts = [v for v in (_cpu_only(a, name) for a in lists) if v is not None]
        return bool(verdicts) and all(verdicts)



class Parametrize:
    """The ``parametrize`` decorators of a project's test functions."""

    def __init__(self, index: ProjectIndex) -> None:
        self.index = index
        self._pending: dict[str, list[Call]] | None = None  # path -> its parametrize calls
        self._params: dict[str, dict[str, list[str]]] = {}  # path -> func id -> its parametrize arglists

    def arglists(self, func: Func) -> list[str]:
        """The arglists of the ``parametrize`` calls decorating ``func``: each
        decorator call belongs to the function defined next below it (a
        decorator's arguments hold no ``def``)."""
        if self._pending is None:
            self._pending = {}
            for caller, i in self.index.calls_named("parametrize"):
                if caller.table is not None and caller.language is Language.PYTHON:
                    self._pending.setdefault(caller.path, []).append(caller.call_at(i))
        if func.path not in self._params:
            byfunc = self._params[func.path] = {}
            defs = sorted((f.scope.span.line, f.id) for f in self.index.functions_in(func.path)
                          if f.scope is not None and f.scope.kind == "function")
            for call in self._pending.get(func.path, ()):
                below = next((fid for line, fid in defs if line > call.span.end_line), None)
                if below is not None:
                    byfunc.setdefault(below, []).append(call.arglist)
        return self._params[func.path].get(func.id, [])


def parametrized_values(arglist: str, name: str) -> list[str] | None:
    """The values ``parametrize(arglist)`` gives ``name``, as source text
    (``parametrize("offload,device", [(False, "cpu"), ...])``: that position
    of every tuple); an empty list when they cannot be read (not literal
    lists, ``indirect=``, tuples of another length); None when it does not
    name ``name``."""
    try:
        call = ast.parse(f"f({arglist})", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [] if re.search(rf"\b{re.escape(name)}\b", arglist) else None
    assert isinstance(call, ast.Call)
    if len(call.args) < 2 or not isinstance(call.args[0], ast.Constant) or not isinstance(call.args[0].value, str):
        return [] if re.search(rf"\b{re.escape(name)}\b", arglist) else None
    names = [n.strip() for n in call.args[0].value.split(",")]
    if name not in names:
        return None
    values = call.args[1]
    if not isinstance(values, (ast.List, ast.Tuple)) or not values.elts \
            or any(k.arg == "indirect" for k in call.keywords):
        return []
    if len(names) == 1:
        return [ast.unparse(v) for v in values.elts]
    at = names.index(name)
    if not all(isinstance(v, (ast.Tuple, ast.List)) and len(v.elts) == len(names) for v in values.elts):
        return []
    return [ast.unparse(v.elts[at]) for v in values.elts]  # type: ignore[attr-defined]


def _cpu_only(arglist: str, name: str) -> bool | None:
    """``parametrize(arglist)`` gives ``name`` only CPU values (True), some
    other value or values it cannot read (False), or does not name it (None)."""
    values = parametrized_values(arglist, name)
    if values is None:
        return None
    return bool(values) and all(_CPU.fullmatch(v) is not None for v in values)


def _bound(func: Func, name: str) -> bool:
    return any(name in a.targets for a in func.assigns) or _with_bound(func, name) \
        or any((c.target or "").strip() == name for c in func.calls)


def _with_bound(func: Func, name: str) -> bool:
    return any((item.target or "").strip() == name for w in func.withs for item in w.items)


def _only_cpu(func: Func, name: str) -> bool:
    """Every binding of local ``name`` is the CPU: an assignment of the literal,
    or a call bound to it that is ``torch.device("cpu")`` (not `pick_device()`)."""
    calls = [c for c in func.calls if (c.target or "").strip() == name]
    if _with_bound(func, name) or not all(_cpu_device_call(c.callee, c.arglist) for c in calls):
        return False
    assigns = [a for a in func.assigns if name in a.targets]
    return bool(assigns or calls) and all(a.op == "=" and len(a.targets) == 1 for a in assigns) \
        and all(_CPU.fullmatch(a.value.strip()) for a in assigns)


def _cpu_device_call(callee: str, arglist: str) -> bool:
    """``torch.device("cpu")``: the binding itself, not a call that picks a device."""
    return callee == "torch.device" and _CPU.fullmatch(arglist.strip()) is not None


_OFF = re.compile(r"""(?:torch\.device\(\s*)?["'](cpu|meta)["']\s*\)?""")


def only_off_device(func: Func, name: str) -> str:
    """``"cpu"`` or ``"meta"`` when every binding of local ``name`` is that
    one device (`device = torch.device("meta")`, `dev = "cpu"`), else ""."""
    calls = [c for c in func.calls if (c.target or "").strip() == name]
    assigns = [a for a in func.assigns if name in a.targets]
    if _with_bound(func, name) or not (assigns or calls) or any(a.op != "=" or len(a.targets) != 1 for a in assigns):
        return ""
    texts = [a.value.strip() for a in assigns] + \
        [c.arglist.strip() if c.callee == "torch.device" else "<call>" for c in calls]
    found = {m.group(1) if m is not None else "" for m in map(_OFF.fullmatch, texts)}
    return found.pop() if len(found) == 1 and "" not in found else ""
