"""Stage 5a, after derive: derived constructions whose every allocation
takes its device from a parameter the call binds to the CPU or ``meta``
(issue 11, round 18).

``SparseArch(tables, torch.device("meta"))``, ``Pool(device="cpu")``, or
``device = torch.device("cpu")`` then ``Pool(device=device)``: the call
passes an off-device literal. Each allocation the construction reaches
(``index.reach``, as the derived site's own search) is followed along its
call path with the values bound at each edge (``values.bind_edge``); its
``device=`` (a move's target) is a parameter holding the literal, or an
attribute of the object being built that holds it: ``self.device`` stored
from the parameter in the constructor, through a base constructor the
constructor calls (`super().__init__(device=device)` storing
`self._device = device`) or a property returning such an attribute
(`def device(self): return self._device`). The object's attribute is
assigned once in its class (the store), so a method that runs later reads
the call's value. When every allocation that counts is so, the call
allocates nothing on the device: the derived site is dropped. Anything
unknown (a device variable, a `.device` of a tensor, an attribute stored
twice) keeps it. A list or tuple of only such literals (round 19:
``Pipe(model, devices=["cpu", "cpu"])``) counts for a parameter the callee
takes its devices from, read back as ``devices[j]`` or a local bound only
to one. Round 35b: a call that leaves out a device parameter whose default
is the CPU (``def get_wavlm(device="cpu")`` called ``get_wavlm()``) binds
it to that literal, as if it passed it (the call names no device at all, so
this is looked at only when the callee has such a default and the call
spreads nothing); a ``torch.load``'s place is its ``map_location=``, and
``torch.device(d)`` is where ``d`` is. Another device parameter defaulting
to anything else (``scale_device="cpu", device="cuda"``) keeps the site.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site, Tier
from .cpu_locals import only_off_device
from .index import Func, ProjectIndex, Reach
from .index.values import LITERAL, Env, Value, bind_edge, call_params, off_device, off_devices
from .move_apis import MOVES

_DEPTH = 3  # as the derived sites' own search
_SELF_ATTR = re.compile(r"self\.([A-Za-z_]\w*)")
_ATTR_DEPTH = 4  # properties and base constructors followed for one attribute


def drop_off_device(derived: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """The derived sites, less the calls that bind every allocation's device off the GPU."""
    return [s for s in derived if s.via is None or s.language is not Language.PYTHON or not _off_device(s, index)]


def _off_device(site: Site, index: ProjectIndex) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    caller, call = found
    said = re.search(r"cpu|meta|device", call.arglist) is not None
    if not said and "*" in call.arglist:
        return False  # nothing off-device said at the call (most calls)
    cls = index.constructed_class(caller, call)
    starts = index.constructors(cls) if cls is not None else [f for f in index.resolve(caller, call) if f is not caller]
    if not said and not any(_cpu_default(start) for start in starts):
        return False  # round 35b: nor a device parameter left at a CPU default (`get_model()`)
    known = _off_device_locals(caller, call)
    counted = False
    for start in starts:
        env = bind_edge(caller, call, start, known, index.visible_constants(caller.path))
        devices = [p for p in (start.scope.params if start.scope is not None else ()) if "device" in p]
        if not any(_off(v) for v in env.values()) or not all(_off(env.get(p)) for p in devices):
            return False  # nothing off the GPU, or another device it takes may be the GPU (`dense_device=dev`)
        for reached in index.reach(start, _DEPTH):
            candidate = reached.site
            if not candidate.acquires or (candidate.tier is Tier.T1 and candidate.api not in MOVES):
                continue  # a layer's own weights are counted where they are made (a weight upload is not)
            if not _placed_off(reached, start, env, index):
                return False
            counted = True
    return counted


def _cpu_default(start: Func) -> bool:
    """``start`` takes a device parameter that defaults to the CPU (``def get_model(device="cpu")``)."""
    if start.scope is None or not start.scope.param_defaults:
        return False
    return any("device" in p and _CPU_DEFAULT.fullmatch(d.strip()) for p, d in zip(*call_params(start.scope)))


_CPU_DEFAULT = re.compile(r"""(?:torch\.device\()?["']cpu["']\)?""")


def _off_device_locals(caller: Func, call: Call) -> dict[str, Value]:
    """The call's plain-name arguments that are locals of the caller bound only
    to the CPU or meta device (`device = torch.device("cpu")`), and its
    `x.device` arguments of a local tensor the caller makes on the host
    (`x = torch.rand(2, 3)`: no device, no move)."""
    out: dict[str, Value] = {}
    params = caller.scope.params if caller.scope is not None else ()
    for arg in split_args(call.arglist):
        name = arg.text.strip()
        if name.isidentifier() and name not in params:
            literal = only_off_device(caller, name)
            if literal:
                out[name] = Value(LITERAL, literal, f"{caller.path}: {name} is only ever {literal}")
        elif name.endswith(".device") and name[:-7].isidentifier() and name[:-7] not in params \
                and _host_tensor(caller, name[:-7]):
            out[name] = Value(LITERAL, "cpu", f"{caller.path}: {name[:-7]} is a host tensor made without a device")
    return out


_HOST_FACTORY = re.compile(r"torch\.(?:rand|randn|randint|randperm|zeros|ones|empty|full|arange|linspace|eye|tensor)")


def _host_tensor(func: Func, name: str) -> bool:
    """Every binding of local ``name`` is a torch factory call given no
    device, not made on the device by a default-device context (no site)."""
    calls = [c for c in func.calls if (c.target or "").strip() == name]
    assigns = [a for a in func.assigns if name in a.targets]
    if not calls or any(s.target == name for s in func.sites) or any(
            _HOST_FACTORY.fullmatch(c.callee) is None or "device" in c.arglist for c in calls):
        return False
    return all(a.op == "=" and len(a.targets) == 1 and _HOST_FACTORY.match(a.value.strip()) is not None
               and ")." not in a.value for a in assigns)


def _placed_off(reached: Reach, start: Func, env: Env, index: ProjectIndex) -> bool:
    """The allocation ``reached`` (from ``start`` under ``env``) names a device
    that holds the CPU or meta literal."""
    func, obj = start, (start, env) if _constructor(start) else None
    for i, hop in enumerate(reached.hops):
        nxt = reached.hops[i + 1] if i + 1 < len(reached.hops) else None
        callee = index.func(nxt.path, nxt.caller) if nxt is not None else index.func(reached.site.path,
                                                                                  reached.site.scope)
        if callee is None:
            return False
        env = bind_edge(func, hop.call, callee, env, index.visible_constants(func.path))
        if _constructor(callee) and not hop.call.callee.startswith("super"):
            obj = (callee, env)  # a new object: its own attributes from here on
        elif not hop.call.callee.startswith(("self.", "super")):
            obj = None  # a plain function: `self` is not the object being built
        func = callee
    text = _device_text(func, reached.site)
    if not text:
        return False
    if text in env:
        return off_device(env[text])
    if _item_of_off(func, text, env):
        return True
    m = _SELF_ATTR.fullmatch(text)
    return m is not None and obj is not None and off_device(attr_value(obj[0], obj[1], m.group(1), index,
                                                                        _ATTR_DEPTH))


def _off(value: Value | None) -> bool:
    return off_device(value) or off_devices(value)


_DEVICE_CALL = re.compile(r"torch\.device\(\s*([A-Za-z_]\w*)\s*\)")
_ITEM = re.compile(r"([A-Za-z_]\w*)\[[^\[\]]*\]")


def _item_of_off(func: Func, text: str, env: Env) -> bool:
    """``devices[j]``, or a local every binding of which is one, where
    ``devices`` holds only CPU/meta devices (`Pipe(..., devices=["cpu"])`)."""
    m = _ITEM.fullmatch(text)
    if m is not None:
        return off_devices(env.get(m.group(1)))
    if not text.isidentifier() or (func.scope is not None and text in func.scope.params) \
            or any((c.target or "").strip() == text for c in func.calls):
        return False
    assigns = [a for a in func.assigns if text in a.targets]
    return bool(assigns) and all(a.op == "=" and len(a.targets) == 1 and _item_of_off(func, a.value.strip(), env)
                                 for a in assigns)


def _constructor(func: Func) -> bool:
    return func.scope is not None and func.scope.role == "constructor"


def _device_text(func: Func, site: Site) -> str:
    """The site call's ``device=`` argument (a move's target), or ""."""
    moves = site.api in MOVES
    for call in func.calls:
        if call.span.line != site.span.line or call.span.col != site.span.col:
            continue
        args = split_args(call.arglist)
        if moves:
            first = next(iter(args), None)
            return first.text.strip() if first is not None and first.keyword in (None, "device") else ""
        key = "map_location" if site.api == "torch.load" else "device"  # round 35b: `torch.load(f, map_location=d)`
        text = next((a.text.strip() for a in args if a.keyword == key), "")
        wrapped = _DEVICE_CALL.fullmatch(text)
        return wrapped.group(1) if wrapped is not None else text  # `torch.device(device)`: the parameter
    return ""


def attr_value(ctor: Func, env: Env, attr: str, index: ProjectIndex, depth: int) -> Value | None:
    """What ``self.attr`` holds once ``ctor`` ran under ``env``: a store of a
    parameter in it (the only store in its class), a property returning
    another attribute, or a base constructor it calls that stores it."""
    if depth <= 0 or ctor.owner is None:
        return None
    stores = _stores(index, ctor, attr)
    if stores is not None:
        if len(stores) != 1 or stores[0][0] is not ctor:
            return None  # stored twice, or by another method that may run later
        value = stores[0][1]
        return env.get(value) if value.isidentifier() else None
    prop = index.method_lookup(ctor.owner, attr)
    if len(prop) == 1 and len(prop[0].returns) == 1:
        m = _SELF_ATTR.fullmatch(prop[0].returns[0].value.strip())
        if m is not None and m.group(1) != attr:
            return attr_value(ctor, env, m.group(1), index, depth - 1)
    for call in ctor.calls:
        if call.callee.startswith("super") and call.callee.endswith("__init__"):
            for base in index.resolve(ctor, call):
                if _constructor(base):
                    return attr_value(base, bind_edge(ctor, call, base, env, index.visible_constants(ctor.path)),
                                       attr, index, depth - 1)
    return None


def _stores(index: ProjectIndex, ctor: Func, attr: str) -> list[tuple[Func, str]] | None:
    """Every `self.attr = value` in the methods of ``ctor``'s class, or None when there is none."""
    owner = ctor.owner
    if owner is None:
        return None
    prefix = owner.qualname + "."
    target = "self." + attr
    found = [(func, assign.value.strip() if assign.op == "=" else "<op>")
             for func in index.functions_in(ctor.path)
             if func.qualname == ctor.qualname or func.qualname.startswith(prefix)
             for assign in func.assigns if any(t.strip() == target for t in assign.targets)]
    found += [(func, "<call>") for func in index.functions_in(ctor.path) if func.qualname.startswith(prefix)
              for c in func.calls if (c.target or "").strip() == target]
    return found or None
