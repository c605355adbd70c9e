"""Stage 5, after the tiers from callers: lifetimes that the code around a
buffer decides, read from the index (other functions, other methods of the
class, the guards around the site).

- **Pinned, returned to a keeper → T5b.** A pinned host buffer a function
  returns (``return pin``) where every call of the function, directly or
  through one more function that returns it on, stores the result on an
  object or in its container (``self.pin_weight = self._create_pin(...)``,
  ``self.saved[n] = copy_to_cpu(...)``) outlives the call: it is kept, not
  transient staging. A derived pinned site whose call is stored so is kept
  too.
- **Pinned, returned by a wrapper method → its callers' tier.** A method
  that returns a pinned buffer made from its argument (``def
  pin_memory(self, tensor): return tensor.pin_memory()``) and that no call
  resolves to (it is reached through an object the index cannot type:
  ``get_accelerator().pin_memory(t)``) is known by its name: the calls
  ``<receiver>.pin_memory(t)`` with an argument. When production calls keep
  the result on an object (stored there, or held in a local that is then
  stored there) at least as often as they drop it, the wrapper's buffers
  are mostly kept: T5b. A pinned buffer held in a local that the function
  then stores on an object (``t = pin(t)`` ... ``param.ds_tensor = t``) is
  kept the same way.
- **Pinned, kept by the module or a pool → T5b.** A pinned host buffer
  stored to a module global that the function re-makes only under a guard naming it (``global
  X`` ... ``if X is None or X.shape[0] < n: X = ...``), lives for the
  process, and so does one kept in an attribute of the enclosing class or
  module-level function named by its global name, under a test that the
  cached member is missing or too small (round 26: ``if not hasattr(f,
  "_buf") or ...: f._cpu = t.pin_memory()``), or per key in a container on the
  object under a test that the key is missing (``lazy_members.keyed_cache``:
  ``st = self.x.get(k)``; ``if st is None: st = {"pin": ...}``; ``self.x[k] =
  st``). So does one a method returns from a pool: it takes buffers from a
  container on ``self`` (``self._store.get(k)``) that another method of the
  class puts them back into (``self._store.setdefault(k, []).append(t)``).
- **Pinned, released per phase → T5a.** A pinned host buffer a method keeps
  on ``self`` where another method of the class releases it (``self.buf =
  None`` or ``del self.buf``) is staging for one phase, set up and released
  around each use; ``__del__``, ``close``, ``shutdown`` and ``__exit__`` run
  once at the end and release nothing per phase, a constructor's
  ``self.buf = None`` declares the member, and a method that also sets the
  member up, or sets it to ``None`` only in a branch (the case without a
  buffer), is a setter. So is a local a method adds to a member list
  (``self.bufs.append(buf)``) that another method empties (``self.bufs =
  []``); an initialiser's (``init*``, ``setup*``) or an annotated
  ``self.bufs: list = []`` declares the list.
- **Optimizer state created once → T2, pinned T5b** (``state_once``): a
  buffer stored into an entry of the object's state dict under a guard that
  it is not there yet is created on the first call and kept.
- **Storage of parameters → T1.** A device buffer that becomes what a
  parameter or buffer holds: stored to ``p.data`` (``weight.data =
  weight.data.to(device)``, ``buffer.data = buffer.cuda()``; not
  ``self.data``, an object's own member, nor a ``.grad``), into
  ``module._parameters[name]`` / ``_buffers[name]``, or an arena kept on
  ``self`` whose views the same function assigns to ``.data`` (``param.data
  = self.flat[a:b].view(shape)``): model-resident. Round 28: also
  ``self.x.data = ...`` where the class makes ``self.x`` a parameter or
  registers it (``lazy_members.weight_member``; a plain member's ``.data``
  is not), and a local that a later ``.data`` store takes whole before
  anything rebinds it (``t = w.to(d)`` ... ``self.w.data = t``).
- **Module-level loops → T4.** A module-level loop allocates per
  iteration (``for images, labels in loader: images.cuda()``): a script's
  scratch, not a buffer of the process. (Code under ``if __name__ ==
  "__main__":`` runs once per process: module level, T2; round 29:
  ``script_intermediates`` keeps what a pass adds to a container.) Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..model import PRODUCTION, Language, Site, SiteKind, Tier
from .built_per_call import per_call_pinned
from .index import Func, ProjectIndex
from .kept_stores import ADD as _ADD
from .kept_stores import MEMBER as _MEMBER
from .kept_stores import stored_later as _stored_later
from .lazy_members import OWN_DATA, data_store_of_local, keyed_cache, module_holder_test, weight_member
from .roles import conventional_role
from .state_once import state_created_once

# an attribute of an object, or an entry of one: `self.pin`, `self.saved[n]`, `ctx.cache[k]`
_ON_OBJECT = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\[[^\]]*\])*")
_SET_UP = re.compile(r"_?(?:init|setup|set_up)")
_FINAL = frozenset({"__del__", "close", "shutdown", "__exit__", "__aexit__", "teardown", "destroy"})


def decided_by_use(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    out = []
    callers: dict[str, list[tuple[Func, str | None]]] = {}
    storing: dict[str, bool] = {}
    named: dict[tuple[str, int], str] = {}
    for site in sites:
        if site.language is Language.PYTHON:
            if site.kind is SiteKind.PINNED_HOST and site.tier is Tier.T5A and not per_call_pinned(site):
                kept = _kept_by_module(site, index) if site.via is None else site
                kept = kept if kept is not site else _kept_by_caller(site, index, callers, named)
                site = kept if kept is not site or site.via is not None else state_created_once(site, index)
            elif site.kind is SiteKind.PINNED_HOST and site.tier is Tier.T5B and site.via is None:
                site = _released_per_phase(site, index)
            elif site.kind is SiteKind.DEVICE and site.via is None and site.tier is not Tier.T1 \
                    and (place := _holds_weights(site, index, storing)):
                site = dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                    f"model-resident: becomes the storage of parameters or buffers ({place} in "
                    f"{site.scope}; was: {site.tier_reason})"))
            elif site.kind is SiteKind.DEVICE and site.tier is Tier.T4 and site.via is None:
                site = state_created_once(site, index)
            elif site.scope == "<module>" and site.tier is Tier.T2 and site.kind is SiteKind.DEVICE:
                site = _script_code(site, index)
        out.append(site)
    return out


def _calls_of(func: Func, index: ProjectIndex, memo: dict[str, list[tuple[Func, str | None]]]
              ) -> list[tuple[Func, str | None]]:
    """Every call of ``func`` one call up: the calling function and where the
    value goes (the call's target; ``return`` for ``return f(...)``)."""
    found = memo.get(func.id)
    if found is not None:
        return found
    found = []
    for fid, depth in index.callers_within([func], 1).items():
        caller = index.funcs.get(fid)
        if depth != 1 or caller is None:
            continue
        returned = {r.line for r in caller.returns}
        for call in caller.calls:
            if func in index.resolve(caller, call):
                target = call.target
                if target is None and call.span.line in returned:
                    target = "return"
                found.append((caller, target))
    memo[func.id] = found
    return found


def _keeper(func: Func, index: ProjectIndex, memo: dict[str, list[tuple[Func, str | None]]],
            depth: int = 0) -> str:
    """Where every call of ``func`` keeps its result on an object
    (``Caller.method keeps it in self.x``), or ""."""
    calls = _calls_of(func, index, memo)
    if not calls:
        return ""
    kept = []
    for caller, target in calls:
        names = [t.strip() for t in (target or "").split(",")]
        if target is not None and target != "return" and all(_ON_OBJECT.fullmatch(t) for t in names):
            kept.append(f"{caller.qualname} keeps it in {target.strip()}")
        elif depth == 0 and (target == "return" or _returned_on(caller, names)):
            further = _keeper(caller, index, memo, depth + 1)
            if not further:
                return ""
            kept.append(f"{caller.qualname} returns it, {further}")
        else:
            return ""
    return "; ".join(sorted(set(kept))[:2])


def _returned_on(caller: Func, names: list[str]) -> bool:
    """A local the caller returns holds the value: the name itself, an
    element of a returned tuple, or a local container it is stored in
    (``out[k] = make(...)`` ... ``return out``)."""
    if len(names) != 1:
        return False
    m = re.fullmatch(r"([A-Za-z_]\w*)(?:\[[^\]]*\])?", names[0])
    if m is None:
        return False
    returned = {part.strip() for r in caller.returns for part in r.value.strip().strip("()").split(",")}
    return m.group(1) in returned


def _kept_by_caller(site: Site, index: ProjectIndex, memo: dict[str, list[tuple[Func, str | None]]],
                    named: dict[tuple[str, int], str]) -> Site:
    if site.via is not None:
        target = (site.target or "").strip()
        if target and _ON_OBJECT.fullmatch(target):
            return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
                f"persistent pinned host buffer kept in {target} by {site.scope} (was: {site.tier_reason})"))
        return site
    func = index.func(site.path, site.scope)
    if func is None:
        return site
    local = (site.target or "").strip()
    # `Owner.pins = pin(...)` in a method of Owner: on the class (not a loop variable's member,
    # `buffer.cpu_data = t.pin_memory()`, re-made per offload; `self.x` the patterns decided)
    owner = func.owner.name if func.owner is not None else None
    if local.isidentifier() or (_MEMBER.fullmatch(local) and local.split(".")[0] == owner):
        place = _kept_at(func, local, site.stmt_line or site.span.line)
    else:  # inside a larger expression: `self.parts.append(t.pin_memory())`
        own = next((c.callee for c in func.calls if c.span == site.span), "") if site.target is None else ""
        place = _kept_at(func, None, site.span.line, own) if own else ""
    if place:
        return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
            f"persistent pinned host buffer kept in {place} by {site.scope}"
        + (f" (held in {local} first)" if local.isidentifier() else "")))
    if not _returned(site, func):
        return site
    keeper = _keeper(func, index, memo)
    if not keeper and func.owner is not None and not _calls_of(func, index, memo):
        keeper = _kept_by_name(func, index, named)
    if not keeper:
        return site
    return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
        f"persistent pinned host buffer returned by {site.scope} to a caller that keeps it: {keeper}"))


def _kept_by_name(func: Func, index: ProjectIndex, named: dict[tuple[str, int], str]) -> str:
    """For a method no call resolves to: the production calls by its name
    with an argument (``get_accelerator().pin_memory(t)``) keep the result
    at least as often as they drop it (``Caller keeps it in self.x; ...``), or ""."""
    name = func.name
    params = func.scope.params if func.scope is not None else ()
    if len(params) < 2 or not name.isidentifier():
        return ""
    found = named.get((name, len(params)))
    if found is None:  # the same wrapper in every accelerator class: its calls are read once
        found = named[(name, len(params))] = _named_calls_keep(name, index)
    return found


def _named_calls_keep(name: str, index: ProjectIndex) -> str:
    suffix = "." + name
    kept: list[str] = []
    dropped = 0
    for fid in sorted(index.callers_matching(lambda c: c.endswith(suffix))):
        caller = index.funcs.get(fid)
        if caller is None or caller.language is not Language.PYTHON or \
                conventional_role(caller.path) != PRODUCTION:
            continue
        for call in caller.calls:
            if not call.callee.endswith(suffix) or not call.arglist.strip() or call.callee.startswith("self.") \
                    or caller.name == name:
                continue  # not the wrapper's own body (`return tensor.pin_memory(device=d)`)
            place = _kept_at(caller, call.target, call.span.line, call.callee)
            if place:
                kept.append(f"{caller.qualname} keeps it in {place}")
            else:
                dropped += 1
    if len(kept) < 2 or len(kept) < dropped:
        return ""
    return f"{len(kept)} of {len(kept) + dropped} production calls `.{name}(...)` keep it: " + \
        "; ".join(sorted(set(kept))[:2])


# a member of an object, however reached: `self.buf`, `self.groups[i].grad`, `param.ds_tensor`


def _kept_at(caller: Func, target: str | None, line: int, callee: str = "") -> str:
    """Where a call's value stored to ``target`` at ``line`` ends on an
    object: the target itself (a member, or an entry of a container the
    caller was handed: ``state[k] = pin(...)``), a member a later statement
    stores the local in (``t = pin(t)`` ... ``param.ds_tensor = t`` or
    ``self.parts.append(t)``), or, for a call inside a larger expression,
    the member the statement builds (``self.bufs = [pin(...) for ...]``,
    ``self.bufs.append(pin(...))``)."""
    params = caller.scope.params if caller.scope is not None else ()
    if target is None:
        if not callee:
            return ""
        text = callee + "("
        for a in caller.assigns:
            if a.line <= line <= a.line + a.value.count("\n") and text in a.value:
                member = next((t for t in a.targets if _MEMBER.fullmatch(t)), "")
                if member or len(a.targets) != 1 or not a.targets[0].isidentifier():
                    return member
                return _stored_later(caller, a.targets[0], a.line)
        for c in caller.calls:
            if c.span.line <= line <= c.span.end_line and text in c.arglist and \
                    (m := _ADD.fullmatch(c.callee)) is not None and _MEMBER.fullmatch(m.group(1)):
                return m.group(1)
        return ""
    names = [t.strip() for t in target.split(",")]
    if len(names) != 1:
        return ""
    name = names[0]
    if _MEMBER.fullmatch(name):
        return name
    root = re.fullmatch(r"([A-Za-z_]\w*)\[[^\]]*\]", name)
    if root is not None and root.group(1) in params and root.group(1) not in ("self", "cls"):
        return f"{name} (a container handed in by its caller)"
    return _stored_later(caller, name, line) if name.isidentifier() else ""


_PUT = r"\.(?:append|appendleft|add|put|put_nowait|extend)"
_PUT_BACK = re.compile(r"self\.([A-Za-z_]\w*)" + _PUT)
_CHAINED_PUT = re.compile(r"\(\.\.\.\)" + _PUT)
_SETDEFAULT = re.compile(r"self\.([A-Za-z_]\w*)\.setdefault")
_TAKE = re.compile(r"self\.([A-Za-z_]\w*)\.(?:get|pop|popleft|get_nowait|setdefault)")


def _kept_by_module(site: Site, index: ProjectIndex) -> Site:
    func = index.func(site.path, site.scope)
    if func is None:
        return site
    if site.scope == "<module>":
        return site
    target = (site.target or "").strip()
    module = index.func(site.path, "<module>")
    globals_ = {t for a in module.assigns for t in a.targets} if module is not None else set()
    if re.fullmatch(r"[A-Za-z_]\w*", target) and target in globals_:
        for b in func.blocks:
            if b.kind.startswith("if") and b.span.contains_line(site.span.line) \
                    and globals_ & set(re.findall(r"[A-Za-z_]\w*", b.test)):
                return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
                    f"persistent pinned host buffer kept in the module global {target}: {site.scope} re-makes it "
                    f"only under `if {b.test.strip()}`"))
    held = module_holder_test(site, func)
    if held is not None:
        return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
            f"persistent pinned host buffer kept in {held[0]}, an attribute of a module-level {held[2]}: "
            f"{site.scope} re-makes it only under `if {' '.join(held[1].split())}`"))
    keyed = keyed_cache(site, func) if func.owner is not None else None
    if keyed is not None:
        return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
            f"persistent pinned host buffer kept per key in {keyed[0]}: {site.scope} makes it only when "
            f"`{' '.join(keyed[1].split())}` says the key is missing"))
    if site.kept != "return" or func.owner is None:
        return site
    taken = {m.group(1) for c in func.callees if (m := _TAKE.fullmatch(c))}
    for methods in func.owner.methods.values():
        for method in methods:
            if method is func:
                continue
            callees = method.callees
            # `self.x.setdefault(k, []).append(t)`: the chained call's callee is `(...).append`
            chained = any(_CHAINED_PUT.fullmatch(c) for c in callees)
            for c in callees:
                m = _PUT_BACK.fullmatch(c) or (_SETDEFAULT.fullmatch(c) if chained else None)
                if m is not None and m.group(1) in taken:
                    return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
                        f"pooled pinned host buffer: {site.scope} hands it out from self.{m.group(1)} and "
                        f"{method.qualname} puts it back for reuse"))
    return site


def _returned(site: Site, func: Func) -> bool:
    """The buffer is returned, or stored into a local container the function
    returns (``out[k] = pin`` ... ``return out``): what the caller gets holds it."""
    if site.kept == "return":
        return True
    root = re.fullmatch(r"([A-Za-z_]\w*)\[.*", site.kept)
    params = func.scope.params if func.scope is not None else ()
    if root is None or root.group(1) in params or root.group(1) in ("self", "cls"):
        return False
    returned = {part.strip() for r in func.returns for part in r.value.strip().strip("()").split(",")}
    return root.group(1) in returned


def _released_per_phase(site: Site, index: ProjectIndex) -> Site:
    target = (site.target or "").strip()
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None:
        return site
    empty: tuple[str, ...] = ("None",)
    if target.isidentifier():  # a local the method adds to a member list (`self.bufs.append(buf)`)
        line = site.stmt_line or site.span.line
        target = next((m.group(1) for c in func.calls if c.span.line > line and c.arglist.strip() == target
                       and (m := _ADD.fullmatch(c.callee)) is not None), "")
        empty = ("None", "[]", "{}", "list()", "dict()")  # emptying the container releases its buffers
    if not target.startswith("self."):
        return site
    for name, methods in func.owner.methods.items():
        if name in _FINAL or name == func.name or (len(empty) > 1 and _SET_UP.match(name)):
            continue  # an initialiser's `self.bufs = []` declares the list
        for method in methods:
            if method.scope is not None and method.scope.role == "constructor" or _called_by_constructor(method):
                continue  # `self.buf = None` declares it (in `__init__` or an initialiser it calls)
            if any(c.target == target for c in method.calls) or \
                    any(target in a.targets and a.op != "del" and a.value.strip() not in empty for a in method.assigns):
                continue  # sets it up too (`None` in the branch without one): a setter, no release
            branches = [b.span for b in method.blocks if b.kind in ("if", "elif", "else")]
            for a in method.assigns:
                if any(span.contains_line(a.line) for span in branches):
                    continue  # `else: self.buf = None`: a branch without a buffer, no release
                if target in a.targets and (a.op == "del" or a.value.strip() in empty) and not (
                        len(empty) > 1 and a.type):  # `self.bufs: list[Tensor] = []` declares it
                    return dataclasses.replace(site, tier=Tier.T5A, tier_reason=(
                        f"pinned staging for one phase: kept in {target} by {site.scope} and released by "
                        f"{method.qualname} after each use"))
    return site


def _called_by_constructor(method: Func) -> bool:
    """``method`` is an initialiser its class's constructor calls (``self._init_buffers()``)."""
    owner = method.owner
    return owner is not None and any(
        c.callee == f"self.{method.name}" for ctor in owner.methods.get("__init__", ()) for c in ctor.calls)


_DATA = re.compile(r"(?!self\.|cls\.)[A-Za-z_]\w*(?:\.(?!grad\b)[A-Za-z_]\w*)*\.data"
                   # a sub-module's weight, replaced whole or in place: `linear.weight = ...`,
                   # `self.patch_embed.proj.weight.data = ...` (not `self.weight`: the object's own);
                   # a module reached through a getter without arguments: `self.get_base_layer().weight = ...`
                   r"|(?:(?!self\.|cls\.)[A-Za-z_]\w*|(?:self|cls)\.[A-Za-z_]\w*(?:\(\))?)"
                   r"(?:\.[A-Za-z_]\w*(?:\(\))?)*\.(?:weight|bias)(?:\.data)?"
                   # the object's own weight's storage replaced: `self.weight.data = ...`
                   r"|(?:self|cls)\.(?:weight|bias)\.data")
_REGISTERED = re.compile(r"[A-Za-z_][\w.]*\._(?:parameters|buffers)\[[^\]]+\]")


def weight_storage(target: str) -> bool:
    """Whether a store to ``target`` replaces a parameter's or buffer's
    storage (`p.data`, `linear.weight`, `self.proj.weight.data`)."""
    return _DATA.fullmatch(target) is not None


def _holds_weights(site: Site, index: ProjectIndex, storing: dict[str, bool]) -> str:
    """Where the buffer becomes a parameter's or buffer's storage, or ""."""
    target = (site.target or "").strip()
    if _DATA.fullmatch(target) or _REGISTERED.fullmatch(target):
        return f"stored to {target}"
    func = index.func(site.path, site.scope)
    if func is None:
        return ""
    known = storing.get(func.id)
    if known is None:  # most functions store nothing to `.data` or `_parameters`: asked once each
        call_targets = [func.table.targets[i] for i in func.call_ix] if func.table is not None else []
        known = storing[func.id] = any(t.endswith(".data") or _REGISTERED.fullmatch(t)
                                       for a in func.assigns for t in a.targets) or any(
            t and (t.endswith(".data") or "._parameters[" in t or "._buffers[" in t) for t in call_targets)
    if not known:
        return ""
    line = site.stmt_line or site.span.line
    # handed to the call whose value is registered: `m._parameters[n] = cls(t.to(device))`
    for c in func.calls:
        if c.span.line == line and c.target and _REGISTERED.fullmatch(c.target.strip()):
            return f"handed to {c.target.strip()}"
    own = OWN_DATA.fullmatch(target)
    if own is not None and (why := weight_member(func, own.group(1))):
        return f"stored to {target}, {why}"
    if target.isidentifier():  # held in a local first: `t = t.to(device)` ... `owner._buffers[leaf] = t`
        held = next((t for a in func.assigns if a.line > line and a.value.strip() == target
                     for t in a.targets if _REGISTERED.fullmatch(t)), "")
        held = held or data_store_of_local(func, target, line, _DATA)
        return f"held in {target}, stored to {held}" if held else ""
    if not re.fullmatch(r"self\.[A-Za-z_]\w*", target):
        return ""
    view = re.compile(re.escape(target) + r"\s*[\[.]")
    stores = [(a.line, a.targets, a.value) for a in func.assigns] + \
        [(c.span.line, (c.target,), c.callee) for c in func.calls if c.target]
    for at, targets, value in stores:
        data = [t for t in targets if t.endswith(".data") and not t.startswith(target)]
        if at > site.span.line and data and view.search(value) is not None:
            return f"{target}, whose views become {data[0]}"
    return ""


def _script_code(site: Site, index: ProjectIndex) -> Site:
    func = index.func(site.path, "<module>")
    if func is None:
        return site
    if site.target is None and (operand := _operand(site, func)):
        return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
            f"an operand of `{operand}` at module level: the arithmetic makes a new tensor, this one is "
            "dropped at once"))
    for block in func.blocks:
        if not block.span.contains_line(site.span.line):
            continue
        if block.kind == "loop":
            return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                f"{PER_LOOP} (line {block.stmt.line if block.stmt else block.span.line})"))
    return site


PER_LOOP = "per iteration of a module-level loop"


_ARITHMETIC = frozenset("+-*/%@")


def _operand(site: Site, func: Func) -> str:
    """The statement's value when the allocation is an operand of arithmetic
    in it (``a = (torch.rand(n) - 0.5) + b``), or ""."""
    line = site.stmt_line or site.span.line
    for a in func.assigns:
        if a.line != line or a.op != "=":
            continue
        value = a.value
        name = site.api.rsplit(".", 1)[-1] + "("
        at = value.find(name)
        while at >= 0:
            depth, end = 0, at + len(name) - 1
            for end in range(at + len(name) - 1, len(value)):
                depth += {"(": 1, ")": -1}.get(value[end], 0)
                if depth == 0:
                    break
            after = value[end + 1:].lstrip(" )")
            before = value[:at].rstrip(" (")
            start = before[-1] if before else ""
            if (after[:1] in _ARITHMETIC and after[:2] != "**") or (start in _ARITHMETIC and not before.endswith("**")):
                return " ".join(value.split())
            at = value.find(name, at + 1)
    return ""
