"""Stage 5, after ``stateless_modules``: a move of a module whose
constructor already made every tensor on the move's device moves nothing
(issue 11, round 23).

    args = Arguments(hidden_size=h)          # device: field(default_factory=torch.cuda.current_device)
    mlp = MLP(args)                          # every weight: torch.empty(..., device=args.device)
    mlp.cuda(torch.cuda.current_device())    # no site: already there

The receiver is a local bound, above the move, to the construction of a
project class. Walking its constructor -- ``super().__init__``, the
sub-modules it builds, its own methods and project functions it calls, up
to four calls down, each handed the configuration or the device through
its parameters (positionally or by keyword) or ``self.x = p`` -- every
device allocation there is given ``device=C.device`` (``C`` holding the
configuration) or ``device=D`` (``D`` holding the device), every torch
layer (``nn.Linear(..., device=...)``) too, and nothing is made without a
device (no factory left to the default device, no ``nn.Parameter`` of a
tensor that is no site there). A call the walk cannot resolve is read by
what it is handed: one handed the configuration or the device
(``registry.get(args)``) builds where that says; a builtin, ``np.*`` or
``math.*`` makes no tensor; any other class built, or value kept on
``self`` or returned, may hold host tensors and keeps the site. The construction
hands in, for the configuration, a local bound to ``Config(...)`` whose
``device=`` (or, not given, its class's ``device`` field default:
``field(default_factory=torch.cuda.current_device)``, ``"cuda"``) is the
move's target, or the target itself for the device: ``torch.cuda.
current_device()``, ``"cuda"`` and a bare ``.cuda()`` all name the current
GPU; a variable must be the same name. A torch layer built with
``device=D`` and moved to ``D`` is the same case. Anything the walk cannot
read, a dtype changed by the same move, or another device keeps the site.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site, SiteKind
from .index import Func, ProjectIndex
from .move_apis import MOVES, without_moves

_CURRENT_GPU = re.compile(r"""torch\.cuda\.current_device(?:\(\))?|(["'])cuda\1|torch\.device\((["'])cuda\2\)""")
_TORCH_LAYER = re.compile(r"(?:torch\.)?nn\.([A-Z]\w*)")
# torch classes that hold no tensor of their own (containers hold what the walk already read)
_NO_TENSORS = frozenset({"ModuleList", "ModuleDict", "Sequential", "Identity", "Dropout", "ReLU", "GELU", "SiLU",
                         "Tanh", "Sigmoid", "Softmax", "Flatten"})
_HARMLESS_CLASS = re.compile(r"(?:\w+\.)*(?:\w*(?:Error|Exception|Warning)|Parameter|Optional|Union|Size|device|"
                             r"dtype)")
# calls that make no tensor: builtins, numpy and math (the host), the distributed topology
_PLAIN = re.compile(r"(?:max|min|int|float|bool|str|len|tuple|list|dict|set|sorted|getattr|range|sum|abs|round|"
                    r"isinstance|(?:np|numpy|math|dist|torch\.distributed)\.\w+(?:\.\w+)*)")
_PARAMETER = re.compile(r"(?:\w+\.)*(?:Parameter|register_parameter|register_buffer)")
_INLINE = re.compile(r"([A-Za-z_][\w.]*)\((.*)\)", re.S)
_SELF = frozenset({"self", "cls"})
_DEPTH = 4


def drop_placed_moves(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """The sites, less the moves of modules built on the move's device."""
    return without_moves(sites, MOVES, lambda s: _already_there(s, index))


def _already_there(site: Site, index: ProjectIndex) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    func, move = found
    receiver, _, method = move.callee.rpartition(".")
    target = _move_target(method, move.arglist)
    if target is None:
        return False
    if receiver.endswith(")"):  # built right there: `MoE(args).cuda()`
        build = next((c for c in func.calls if (c.span.line, c.span.col) == (move.span.line, move.span.col)
                      and "(" not in c.callee and receiver.startswith(c.callee + "(")), None)
    else:
        build = _last_binding(func, receiver, site.span.line) if receiver.isidentifier() else None
    if build is None:
        return False
    layer = _TORCH_LAYER.fullmatch(build.callee)
    if layer is not None:  # `nn.Linear(n, m, device=d).to(d)`
        given = _keyword(build.arglist, "device")
        return given is not None and _norm(given) == target
    init = [f for f in index.resolve(func, build) if f.name == "__init__" and f.owner is not None]
    if len(init) != 1 or init[0].scope is None:
        return False
    configs: set[str] = set()
    devices: set[str] = set()
    for name, text in _bound_params(init[0], build):
        if _norm(text) == target:
            devices.add(name)
        elif _config_device(func, text, build.span.line, index) == target:
            configs.add(name)
    return bool(configs or devices) and _made_there(init[0], configs, devices, index, 0, set())


def _move_target(method: str, arglist: str) -> str | None:
    """The device a move names, normalised (``@gpu``: the current GPU); None for a dtype change too."""
    args = split_args(arglist)
    if any(a.keyword not in (None, "device", "non_blocking") for a in args):
        return None
    texts = [a.text.strip() for a in args if a.keyword != "non_blocking"]
    if method == "cuda":
        return "@gpu" if not texts else _norm(texts[0]) if len(texts) == 1 else None
    if method == "to" and len(texts) == 1:
        return _norm(texts[0])
    return None


def _norm(text: str) -> str:
    text = text.strip().removeprefix("device=").strip()
    return "@gpu" if _CURRENT_GPU.fullmatch(text) else text


def _keyword(arglist: str, name: str) -> str | None:
    return next((a.text.strip() for a in split_args(arglist) if a.keyword == name), None)


def _last_binding(func: Func, name: str, line: int) -> Call | None:
    """The call the local ``name`` is last bound to above ``line``, when nothing else binds it there."""
    calls = [c for c in func.calls if (c.target or "").strip() == name and c.span.line < line]
    if not calls or any(name in a.targets and a.line < line for a in func.assigns):
        return None
    last = max(calls, key=lambda c: (c.span.line, -c.span.col))
    return last if "(" not in last.callee else None


def _bound_params(callee: Func, call: Call) -> list[tuple[str, str]]:
    """(parameter of ``callee``, the argument text ``call`` hands it)."""
    assert callee.scope is not None
    params = list(callee.scope.params)
    offset = 1 if params and params[0] in _SELF else 0
    out = []
    positional = 0
    for arg in split_args(call.arglist):
        text = arg.text.strip()
        if text.startswith("*"):
            continue
        if arg.keyword is not None:
            if arg.keyword in params:
                out.append((arg.keyword, text))
        elif positional + offset < len(params):
            out.append((params[positional + offset], text))
            positional += 1
    return out


def _config_device(func: Func, name: str, line: int, index: ProjectIndex) -> str | None:
    """The device a configuration local (or one built right there) holds: its construction's ``device=``,
    or its class's field default."""
    inline = _INLINE.fullmatch(name)
    if inline is not None:
        build = next((c for c in func.calls if c.callee == inline.group(1) and c.span.line <= line
                      and c.arglist.strip() == inline.group(2).strip()), None)
    else:
        build = _last_binding(func, name, line) if name.isidentifier() else None
    if build is None:
        return None
    given = _keyword(build.arglist, "device")
    if given is not None:
        return _norm(given)
    cls = index.constructed_class(func, build)
    if cls is None:
        return None
    for path in set(cls.paths):
        facts = index.files.get(path)
        if facts is None:
            continue
        calls = facts.calls
        for i, callee in enumerate(calls.callees):
            if calls.scopes[i] == cls.qualname and calls.targets[i] == "device" and callee.endswith("field"):
                factory = _keyword(calls.arglists[i], "default_factory")
                default = _keyword(calls.arglists[i], "default")
                return _norm(factory or default or "")
        for assign in facts.assigns:
            if assign.scope == cls.qualname and assign.targets == ("device",):
                return _norm(assign.value)
    return None


def _made_there(func: Func, configs: set[str], devices: set[str], index: ProjectIndex, depth: int,
                seen: set[str]) -> bool:
    """Every tensor ``func`` makes, and what it calls makes, is given the device ``configs``/``devices`` hold."""
    if func.id in seen:
        return True
    seen.add(func.id)
    configs = set(configs)
    devices = set(devices)
    for assign in func.assigns:  # `self.args = args`
        if len(assign.targets) == 1 and assign.targets[0].startswith("self.") and assign.op == "=":
            value = assign.value.strip()
            if value in configs:
                configs.add(assign.targets[0])
            elif value in devices:
                devices.add(assign.targets[0])
    allowed = {f"{c}.device" for c in configs} | devices

    def placed(text: str | None) -> bool:
        return text is not None and text.strip() in allowed

    facts = index.files.get(func.path)
    if facts is not None and any(s.scope == func.qualname for s in facts.default_sites):
        return False  # a factory left to the default device
    for site in func.sites:
        if site.via is not None or site.kind is not SiteKind.DEVICE:
            continue
        found = index.site_call(site)
        if found is None or not placed(_keyword(found[1].arglist, "device")):
            return False
    for call in func.calls:
        callee = call.callee
        layer = _TORCH_LAYER.fullmatch(callee)
        if layer is not None and layer.group(1) not in ("Parameter",):
            if layer.group(1) not in _NO_TENSORS and not placed(_keyword(call.arglist, "device")):
                return False
            continue
        if _PARAMETER.fullmatch(callee) and not any(call.span.contains(s.span) for s in func.sites):
            if callee.endswith("register_parameter") and call.arglist.rstrip().endswith("None"):
                continue  # `register_parameter("bias", None)`
            return False  # a parameter of storage made elsewhere: wherever that is
        targets = index.resolve(func, call)
        if not targets:
            last = callee.rsplit(".", 1)[-1]
            handed = any(a.text.strip() in configs or a.text.strip() in allowed for a in split_args(call.arglist))
            if _HARMLESS_CLASS.fullmatch(callee) or _PLAIN.fullmatch(callee) or handed:
                continue  # a builder handed the configuration (`registry.get(args)`) builds where it says
            if last[:1].isupper() or (call.target or "").strip().startswith("self.") \
                    or any(callee + "(" in r.value for r in func.returns):
                return False  # a class, or a value kept or handed back, the walk cannot read: host tensors, perhaps
            continue
        for target in targets:
            if target.scope is None or target.language is not Language.PYTHON:
                return False
            sub_configs = {p for p, text in _bound_params(target, call) if text in configs}
            sub_devices = {p for p, text in _bound_params(target, call) if text in devices or text in allowed}
            if target.sites or target.calls:
                if depth >= _DEPTH or not _made_there(target, sub_configs, sub_devices, index, depth + 1, seen):
                    return False
    return True
