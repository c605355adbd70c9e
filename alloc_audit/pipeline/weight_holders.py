"""Stage 5, after weight_members: weights held by plain objects (issue 11,
round 33).

Input: the sites and the index; output: the sites, some moved to T1.
Hand-written engines keep a model's weights in classes that are no torch
module (a decoder layer's ``wq``/``wk``/``wv`` as plain members), so no
``Module.to`` moves them and the tool read their moves and allocations as
per-call scratch (T4) or a set-up method's state (T2). What the members
provably are decides, inside the class (one file), not their names:

- a member is a **weight member** when some method binds it to a weight
  (another object's ``.weight``/``.bias``, viewed or detached, or a
  ``torch.cat``/``stack`` of such; a checkpoint's tensor: an entry of what
  ``torch.load``/``load_file`` returned, ``f.get_tensor(k)`` of a
  ``safe_open`` handle; a detached tensor of an object whose weight the same
  method reads, ``self.qweight = module.qweight.detach()`` beside
  ``self.bias = module.bias.detach()``) and every other binding of it is
  ``None``, a move or view of itself, or a ``*_like`` copy of another
  object's member of the same name;
- a method that moves three or more members (``self.wq = self.wq.to(d)``,
  or an object member moved whole, ``self.wk.to(d)``: the object's own
  ``to``) uploads those that are weight members: T1;
- ``self.wq = torch.zeros_like(layer.wq).to(d)``, a same-shaped copy of
  another object's member that the class fills later from a member of that
  name (``self.wq.copy_(layer.wq)``; ``self.wq_buffer`` filled from
  ``layer.wq`` too), is a weight buffer when ``wq`` is a weight member of
  this class or of the class the parameter is annotated with (a class of the
  same file): the ``*_like`` and its move, T1;
- a move of a concatenation of weights or weight members into a member
  (``self.wqkv = torch.cat((self.wq, self.wk, self.wv)).to(d)``): T1;
- a move of an entry by name of a member the class binds only to a whole
  checkpoint (``self.w = torch.load(path)``; ``kw = w[f"{att}key.weight"]``
  then ``kw.to(dev)`` in a low-VRAM forward): T1.

True: ``MistralLayer.to``'s ``self.wq = self.wq.to(device)`` where
``init_parameters`` binds ``self.wq = hf_layer.self_attn.q_proj.weight.detach()``
and ``alloc_space`` binds ``torch.zeros_like(layer.wq).to(device)``.
False: a ``to`` moving ``k_cache``/``v_cache``/``hidden`` made by
``torch.zeros`` (no member holds weights), a ``Batch.to`` moving its
``input_ids`` (bound to parameters), optimizer state made by ``zeros_like(p)``,
a method moving a single member, a member also bound to a fresh buffer, a
buffer shaped like a weight but filled from something else (``out``), a
layer's member not shown to be a tensor (``self.scale = hf_layer.scale``), a
data set saved with ``torch.save`` read by position (``self.data[i]``).
A weight is T1 however often it is loaded (docs/tiers.md 2). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Call, Site, Tier
from .index import ProjectIndex
from .index.symbols import ClassInfo, Func
from .move_apis import TENSOR_MOVES
from .names import SELF_MEMBER
from .retier import Decision, python_device_site, retier
from .weight_members import WEIGHT_VALUE

_LIKE_APIS = frozenset({"torch.zeros_like", "torch.empty_like", "torch.ones_like"})
# a trailing move, cast or view of a bound value: `.to(d, non_blocking=True)`, `.contiguous()`
_TAIL = re.compile(r"\.(?:to|cuda|contiguous|pin_memory|float|half|bfloat16|detach|clone|t)\([^()]*\)$")
_SELF_MOVE = re.compile(r"self\.(\w+)\.(?:to|cuda)")
_LIKE = re.compile(r"torch\.(?:zeros|empty|ones)_like\(\s*([A-Za-z_]\w*)\.(\w+)(?:\.detach\(\))?\s*[,)]")
_CAT = re.compile(r"torch\.(?:cat|stack)\(\s*[\[(](.*)[\])]\s*(?:,[^()]*)?\)", re.S)
# a tensor of another object, detached (`module.qweight.detach().pin_memory()`, `layer.mlp.scales.data`):
# no config value (`hf_layer.scale`, `layer.eps`)
_MIRROR = re.compile(r"([A-Za-z_]\w*)(?:\.\w+)+(?:\.detach\(\)|\.data)(?:\.(?:contiguous|pin_memory|clone|cpu)\(\))*")
_READERS = ("torch.load", "load_file")  # calls that return a whole checkpoint
_CHECKPOINT_CALLS = (*_READERS, "safe_open")
# an entry by name (`w["emb.weight"]`, `self.w[f"{att}key.weight"]`), as a state dict is read; not by position
# (`self.data[i]`, a tensor data set)
_SUBSCRIPT = re.compile(r"""((?:self\.)?[A-Za-z_]\w*)\[\s*f?(?:"[^"]*"|'[^']*')\s*\]""")
_UNIT = 3  # members a method moves together to be the object's own `to`


def weight_holders(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[str, frozenset[str]] = {}

    def members_of(cls: ClassInfo) -> frozenset[str]:
        if cls.key not in memo:
            memo[cls.key] = _weight_members(cls)
        return memo[cls.key]

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T4, Tier.T2) and (site.api in TENSOR_MOVES or site.api in _LIKE_APIS)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.owner is None:
            return None
        if site.api in TENSOR_MOVES:
            entry = _checkpoint_entry(func, site)
            if entry:
                return Tier.T1, (f"weight upload: {site.scope} moves an entry of {entry}, the checkpoint the class "
                                 f"loads, to the device (was: {site.tier_reason})")
        if not site.kept or SELF_MEMBER.fullmatch(site.kept) is None:
            return None
        member = (site.kept or "").removeprefix("self.")
        value = _statement_value(func, site)
        if value is None:
            return None
        weights = members_of(func.owner)
        moved = _SELF_MOVE.match(value)
        if moved and moved.group(1) == member and site.api in TENSOR_MOVES:
            # members the method moves, rebound (`self.wq = self.wq.to(d)`) or objects moved whole (`self.wq.to(d)`)
            unit = {m.group(1) for c in func.calls if (m := _SELF_MOVE.fullmatch(c.callee))
                    and (c.target or "").strip() in ("", f"self.{m.group(1)}")}
            if member in weights and len(unit) >= _UNIT:
                return Tier.T1, (f"weight upload: {site.scope} moves the object's weights ({len(unit)} members, "
                                 f"self.{member} bound to a weight) to the device (was: {site.tier_reason})")
            return None
        if site.api in TENSOR_MOVES and _is_packed(value, weights):
            return Tier.T1, (f"weight upload: {site.scope} moves a concatenation of weights to the device into "
                             f"self.{member} (was: {site.tier_reason})")
        like = _LIKE.match(value)
        if like is None or like.group(1) == "self":
            return None
        source = like.group(2)  # `self.wq_buffer = zeros_like(layer.wq)`, filled from a `.wq`
        if not _filled(func.owner, member, source):
            return None
        holder = _annotated_class(func, like.group(1), index)
        if source in weights or (holder is not None and source in members_of(holder)):
            return Tier.T1, (f"weight upload: {site.scope} allocates self.{member} shaped like "
                             f"{like.group(1)}.{source}, a weight the class fills with copy_ (was: {site.tier_reason})")
        return None

    return retier(sites, eligible, decide)


def _statement_value(func: Func, site: Site) -> str | None:
    """The whole right-hand side of the assignment the site's call sits in: the outermost call on its line
    whose target is the site's member."""
    calls = [c for c in func.calls if c.span.line == site.span.line and (c.target or "").strip() == site.kept]
    return _outer_text(calls) if calls else None


def _outer_text(calls: list[Call]) -> str:
    """The text of the outermost of one statement's calls, a call on a call's result (``(...).to``, as the
    extractor records a receiver too long to keep) read through the call it is made on."""
    outer = min(calls, key=lambda c: (c.span.col, -c.span.end_line, -c.span.end_col))
    if not outer.callee.startswith("(...)"):
        return f"{outer.callee}({outer.arglist})"
    inner = [c for c in calls if c.span.col == outer.span.col and c is not outer
             and (c.span.end_line, c.span.end_col) < (outer.span.end_line, outer.span.end_col)]
    receiver = _outer_text(inner) if inner else "(...)"
    return f"{receiver}{outer.callee[5:]}({outer.arglist})"


def _bindings(cls: ClassInfo, member: str) -> list[tuple[Func, str]]:
    target = f"self.{member}"
    out: list[tuple[Func, str]] = []
    for methods in cls.methods.values():
        for method in methods:
            out += [(method, a.value.strip()) for a in method.assigns
                    if a.op == "=" and target in (t.strip() for t in a.targets)]
            by_line: dict[int, list[Call]] = {}
            for c in method.calls:
                if (c.target or "").strip() == target:
                    by_line.setdefault(c.span.line, []).append(c)
            out += [(method, _outer_text(calls)) for calls in by_line.values()]
    return out


def _strip(value: str) -> str:
    while (m := _TAIL.search(value)) and m.start() > 0:
        value = value[:m.start()]
    return value


def _is_weight(value: str) -> bool:
    value = _strip(value)
    if WEIGHT_VALUE.fullmatch(value):
        return not value.startswith("self.")
    cat = _CAT.fullmatch(value)
    if cat is None:
        return False
    parts = [p.strip() for p in cat.group(1).split(",") if p.strip()]
    return bool(parts) and all(WEIGHT_VALUE.fullmatch(p) and not p.startswith("self.") for p in parts)


def _is_packed(value: str, weights: frozenset[str]) -> bool:
    """A move of a ``torch.cat``/``stack`` of weights or of the class's weight members
    (``torch.cat((self.wq, self.wk, self.wv)).to(d)``)."""
    moved = _TAIL.search(value)
    cat = _CAT.fullmatch(value[:moved.start()]) if moved and moved.group(0).startswith((".to(", ".cuda(")) else None
    if cat is None:
        return False
    parts = [p.strip() for p in cat.group(1).split(",") if p.strip()]
    return bool(parts) and all(SELF_MEMBER.fullmatch(p) and p[5:] in weights
                               or WEIGHT_VALUE.fullmatch(p) and not p.startswith("self.") for p in parts)


def _checkpoint_entry(func: Func, site: Site) -> str:
    """The move takes an entry by name of a member the class binds only to a whole checkpoint (``self.w =
    torch.load(path)``), directly (``self.w["emb.weight"].to(d)``) or through locals of the function (``w =
    self.w``, ``kw = w[f"{att}key.weight"]``, ``kw = kw.to(d)``): the member's name, or "" when it is none."""
    owner = func.owner
    moves = [c for c in func.calls if c.span.line == site.span.line and c.span.col == site.span.col
             and c.callee.endswith((".to", ".cuda"))]
    if owner is None or len(moves) != 1:
        return ""
    moved = moves[0].callee.rsplit(".", 1)[0]
    if moved.isidentifier():
        values = _local_values(func, moved)
        if not values or not all(v.startswith(f"{moved}.") or _SUBSCRIPT.fullmatch(v) for v in values):
            return ""
        roots = {m.group(1) for v in values if (m := _SUBSCRIPT.fullmatch(v))}
    else:
        entry = _SUBSCRIPT.fullmatch(moved)
        roots = {entry.group(1)} if entry else set()
    if len(roots) != 1:
        return ""
    root = roots.pop()
    if root.isidentifier():  # a local bound to the member: `w = self.w`
        bound = set(_local_values(func, root))
        root = bound.pop() if len(bound) == 1 else ""
    member = SELF_MEMBER.fullmatch(root)
    return root if member and _checkpoint_member(owner, member.group(1)) else ""


def _local_values(func: Func, name: str) -> list[str]:
    """What a function binds a local to: assignments and calls whose whole value it is."""
    values = [a.value.strip() for a in func.assigns if a.op == "=" and a.targets == (name,)]
    by_line: dict[int, list[Call]] = {}
    for c in func.calls:
        if (c.target or "").strip() == name:
            by_line.setdefault(c.span.line, []).append(c)
    return values + [_outer_text(calls) for calls in by_line.values()]


def _checkpoint_member(cls: ClassInfo, member: str) -> bool:
    """Every binding of the member is a whole checkpoint read (``torch.load(...)``, ``load_file(...)``) or a
    local of the method bound only to the member itself or to a comprehension over it (a renaming of its keys)."""
    bindings = _bindings(cls, member)
    loaded = False
    for method, value in bindings:
        if value == "None":
            continue
        if re.fullmatch(r"[\w.]+\(.*\)", value, re.S) and value.split("(", 1)[0].endswith(_READERS):
            loaded = True
            continue
        if value.isidentifier() and all(v == f"self.{member}" or (v[:1] in "{[" and f" in {value}" in v)
                                        for v in _local_values(method, value)):
            continue
        return False
    return loaded


def _checkpoint_names(method: Func) -> set[str]:
    """Locals of the method bound to a checkpoint: ``torch.load``/``load_file`` results, ``safe_open`` handles."""
    names = {(c.target or "").strip() for c in method.calls
             if c.target and c.callee.rsplit(".", 1)[-1] in ("load", "load_file", "safe_open")
             and c.callee.endswith(_CHECKPOINT_CALLS)}
    for w in method.withs:
        names |= {i.target.strip() for i in w.items if i.target and i.callee.endswith(_CHECKPOINT_CALLS)}
    return {n for n in names if n.isidentifier()}


def _is_checkpoint(method: Func, value: str) -> bool:
    value = _strip(value)
    root = re.match(r"([A-Za-z_]\w*)(?:\[|\.get_tensor\()", value)
    if root is not None and root.group(1) in _checkpoint_names(method):
        return True
    return re.match(r"torch\.load\(.*\)\[", value) is not None


def _weight_members(cls: ClassInfo) -> frozenset[str]:
    names: set[str] = set()
    for methods in cls.methods.values():
        for method in methods:
            names |= {m.group(1) for a in method.assigns for t in a.targets if (m := SELF_MEMBER.fullmatch(t.strip()))}
            names |= {m.group(1) for c in method.calls if c.target and (m := SELF_MEMBER.fullmatch(c.target.strip()))}
    out = set()
    for member in names:
        sourced = False
        for method, value in _bindings(cls, member):
            if value == "None" or value.startswith(f"self.{member}."):
                continue
            if _is_weight(value) or _is_checkpoint(method, value):
                sourced = True
                continue
            like = _LIKE.match(value)
            if like is not None and like.group(2) == member and like.group(1) != "self":
                continue
            mirror = _MIRROR.fullmatch(value)
            if mirror and mirror.group(1) != "self" and _reads_weight_of(method, mirror.group(1)):
                sourced = True
                continue
            break
        else:
            if sourced:
                out.add(member)
    return frozenset(out)


def _reads_weight_of(method: Func, root: str) -> bool:
    """The method binds some member of the class to a weight of ``root`` (``root.bias.detach()``)."""
    values = [a.value for a in method.assigns] + [f"{c.callee}({c.arglist})" for c in method.calls if c.target]
    return any(v.startswith(root + ".") and _is_weight(v.strip()) for v in values)


def _filled(cls: ClassInfo, member: str, source: str) -> bool:
    """A method of the class fills the member in place from another object's member named ``source``
    (``self.wq_buffer.copy_(layer.wq)``)."""
    return any(c.callee == f"self.{member}.copy_" and (re.match(
        rf"\s*(?!self\.)[A-Za-z_]\w*(?:\.\w+)*\.{source}\s*(?:,|$)", c.arglist) is not None)
        for methods in cls.methods.values() for m in methods for c in m.calls)


def _annotated_class(func: Func, param: str, index: ProjectIndex) -> ClassInfo | None:
    """The class of the same file a parameter of the function is annotated with."""
    scope = func.scope
    if scope is None or param not in scope.params:
        return None
    annotation = scope.param_types[scope.params.index(param)].strip().strip("'\"")
    if not annotation.isidentifier():
        return None
    for other in index.functions_in(func.path):
        owner = other.owner
        if owner is not None and owner.name == annotation and set(owner.paths) == {func.path}:
            return owner
    return None
