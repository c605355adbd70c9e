"""Stage 5, for ``weight_preparation`` (issue 11, round 29): three facts of
one function or class that pass reads, kept apart from it.

- ``live_calls``: a function's calls less those that cannot run or only
  show a value. A branch under a module constant bound once to a false
  literal that nothing rebinds (``DEBUG = False`` ... ``if DEBUG:``) cannot
  run, and a call whose value only goes to ``print`` or a log record
  (``logger.debug(torch.sum(self.layer(self.inp1) - self.out1))``) computes
  nothing the function uses: a debugging forward there is no calibration
  forward.
- ``own_fill``: a method filling its own class's weight with what it is
  handed (``Layer.pack(self, linear, scales)``: ``self.B[:, :] =
  q.to(self.B.device)``, ``self.s.copy_(s)``), the member a parameter or a
  registered buffer (``lazy_members.weight_member``): the layer's weights
  packed from outside. Not a method taking nothing but ``self`` (a reset of
  its own state), nor a move or cast of the object (``to``, ``cuda``,
  ``_apply``: the same weights elsewhere).
- ``installed_state``: what the constructor of a torch module keeps on
  ``self`` (T2), or a construction of it (derived), where every construction
  of the class puts the new module into another one in place of a layer
  (``setattr(module, attr, QuantLinearSim(...))``, the name one it found
  in the module) in a function no step reaches:
  the module becomes part of the model, its state lives with the model's
  weights, T1.

And two facts ``weight_preparation`` has read since round 27:
``builds_module`` (``setattr(parent, name, QLinear(...))``) and
``other_member`` (a call by name through a member bound to another class),
and ``calls_held`` (a call of a value the function holds: a parameter, a
local, a member its class binds; moved here in round 30 for size).

Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from ..arglists import split_args
from ..globs import test_path
from ..model import Assign, Call, Language, Site, Tier
from .default_device import is_module
from .index import ClassInfo, Func, ProjectIndex, last_name
from .index.values import Value, false_branches
from .lazy_members import weight_member
from .retier import Decision

# a logging call (`logger.debug(...)`, `logging.info(...)`): what it is handed is shown, not used
_LOG = re.compile(r"(?:[\w.]*\.)?\w*(?:log|LOG)\w*\.(?:debug|info|warning|warn|error|critical|exception)")
# a store into the object's own member's storage or a slice of it (`self.B[:, :] = q`, `self.w.data = w`),
# and a copy into it
_OWN_FILL = re.compile(r"self\.[A-Za-z_]\w*(?:\.data)?\[.+\]|self\.[A-Za-z_]\w*\.data")
_OWN_COPY = re.compile(r"self\.[A-Za-z_]\w*(?:\.data)?\.copy_")
_OWN_MEMBER = re.compile(r"self\.[A-Za-z_]\w*")
# an object moved or cast whole: its own weights, elsewhere
_CLASS = re.compile(r"[A-Z]\w*")
_CLASS_NAME = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*")  # CapWords, not a constant (`FN`)
_MOVES = frozenset({"to", "cuda", "cpu", "_apply", "half", "float", "double", "bfloat16", "type", "to_empty"})


def live_calls(func: Func, constants: Mapping[str, Value]) -> list[Call]:
    """``func``'s calls less those in a branch that cannot run (by
    ``constants``, the module's constants nothing rebinds) and those inside
    a ``print`` or a logging call."""
    dead = false_branches(func, constants) if func.blocks else []
    shown = [c.span for c in func.calls if c.callee == "print" or _LOG.fullmatch(c.callee)]
    return [c for c in func.calls if not any(d.contains_line(c.span.line) for d in dead)
            and not any(s != c.span and s.contains(c.span) for s in shown)]


def unpatched_constants(index: ProjectIndex, path: str, patched: frozenset[str]) -> dict[str, Value]:
    """The module constants of ``path`` less the names in ``patched``."""
    return {k: v for k, v in index.module_constants(path).items() if k not in patched}


def patched_names(index: ProjectIndex) -> frozenset[str]:
    """The names some file binds as an attribute (``gptq.DEBUG = True``)."""
    return frozenset(t.rpartition(".")[2] for facts in index.files.values() for a in facts.assigns
                     for t in a.targets if "." in t)


def own_fill(func: Func, stores: list[tuple[str, int, str]]) -> tuple[str, str] | None:
    """How ``func`` fills its own class's weight, and the value it writes,
    from ``stores`` (target, line, value) and its ``copy_`` calls; or None."""
    scope = func.scope
    if func.owner is None or scope is None or func.name in _MOVES or \
            not [p for p in scope.params if p.lstrip("*") not in ("self", "cls")]:
        return None
    fills = [(t, line, v) for t, line, v in stores if _OWN_FILL.fullmatch(t)]
    fills += [(c.callee, c.span.line, c.arglist) for c in func.calls if _OWN_COPY.fullmatch(c.callee)]
    for target, line, value in fills:
        member = _OWN_MEMBER.match(target)
        why = weight_member(func, member.group(0)) if member else ""
        if member and why:
            return f"which fills its own weight {member.group(0)} ({why}) at {func.path}:{line}", value
    return None


def installed_state(site: Site, func: Func, index: ProjectIndex, stepped: Callable[[Func], bool],
                    memo: dict[str, str | None], modules: dict[str, bool]) -> Decision | None:
    """T1 for a constructor's kept buffer or a construction of a module class
    that ``installed_by`` finds installed; None otherwise."""
    if site.via is None:
        cls = func.owner if site.tier is Tier.T2 and site.kept.startswith("self.") else None
    else:
        found = index.site_call(site)
        cls = index.constructed_class(*found) if found is not None else None
    if cls is None or cls.language is not Language.PYTHON or not is_module(index, cls.qualname, cls.bases, modules):
        return None
    key = f"installed:{cls.key}"
    if key not in memo:
        memo[key] = installed_by(cls, index, stepped)
    where = memo[key]
    if not where:
        return None
    what = "built" if site.via is not None else "kept"
    return Tier.T1, (f"model state: {what} for a {cls.name} module, which {where} puts into another module in "
                     f"place of a layer, no step reaching it; was: {site.tier_reason}")


def installed_by(cls: ClassInfo, index: ProjectIndex, stepped: Callable[[Func], bool]) -> str | None:
    """The function installing every construction of ``cls`` (outside test
    code) into another module, none of them one that ``stepped`` says a
    step reaches; or None."""
    where: str | None = None
    for caller, i in index.calls_named(cls.name):
        table = caller.table
        if table is None or caller.scope is None or test_path(caller.path):
            continue
        call = table[i]
        if index.constructed_class(caller, call) is not cls:
            continue
        if not _installs(caller, call) or stepped(caller):
            return None
        where = where or f"{caller.qualname} ({caller.path}:{call.span.line})"
    return where


def _installs(func: Func, call: Call) -> bool:
    """``call`` (a construction) is the value ``setattr(parent, name, ...)``
    stores under a name it does not spell out (``attr`` of ``dir(module)``,
    ``name`` of ``named_children()``): a layer found in the module and
    replaced. Not a new member of a literal name (``setattr(model, "cache",
    KVCache(...))``, ``model.cache = KVCache(...)``): a slab or a helper hung on
    the model, whatever it holds."""
    return any(c.callee == "setattr" and c.span.contains(call.span) and c is not call and
               len(args := split_args(c.arglist)) == 3 and args[2].text.strip().startswith(call.callee)
               and args[1].text.strip().isidentifier() for c in func.calls)


def builds_module(func: Func, arglist: str) -> bool:
    """``setattr(parent, name, V)`` where V is a construction of a class
    (``QLinear(...)``) or a local bound to one."""
    args = split_args(arglist)
    if len(args) != 3:
        return False
    value = args[2].text.strip()
    if "(" in value:
        return bool(_CLASS.fullmatch(last_name(value.split("(", 1)[0])))
    bound = [c for c in func.calls if (c.target or "").strip() == value]
    return bool(bound) and all(_CLASS.fullmatch(last_name(c.callee)) for c in bound) and not any(
        value in a.targets for a in func.assigns)


def other_member(caller: Func, callee: str, func: Func, index: ProjectIndex) -> bool:
    """``callee`` (``self.x.name``) runs ``name`` of the class ``caller``'s
    class binds ``self.x`` to, every binding a construction of a class other
    than ``func``'s (or its bases) that defines ``name``."""
    parts = callee.split(".")
    if len(parts) != 3 or parts[0] != "self" or caller.owner is None or func.owner is None:
        return False
    target = f"self.{parts[1]}"
    built = [(m, k) for ms in caller.owner.methods.values() for m in ms for k in m.calls
             if (k.target or "").strip() == target]
    if not built:
        return False
    mine = {func.owner.key, *(b.key for b in index.base_classes(func.owner))}
    for method, call in built:
        cls = index.constructed_class(method, call)
        if cls is None or cls.key in mine or func.owner.key in {b.key for b in index.base_classes(cls)} \
                or not index.method_lookup(cls, func.name):
            return False
    return True


def bound_on(path: str, assign: Assign, index: ProjectIndex) -> bool:
    """``assign`` (``fn = self.helper``) hands the function it names on:
    its target is a member, an entry or unknown, or a local its function
    calls, hands whole to a call or returns. A local it only tests or
    stores in a literal (``bitpack = config.pack`` ... ``if bitpack:``) is
    an attribute read, not a function handed on (round 35)."""
    target = assign.targets[0].strip() if len(assign.targets) == 1 else ""
    func = index.func(path, assign.scope) if target.isidentifier() else None
    if func is None:
        return True
    return any(c.callee == target or any(a.text.strip() == target for a in split_args(c.arglist))
               for c in func.calls) or any(r.value.strip() == target for r in func.returns)


def saved_tensors(func: Func, call: Call) -> str:
    """What ``call`` saves as a checkpoint, when it is one ``func`` builds
    itself (round 35): ``save_file(merged, path)`` or ``torch.save(merged,
    path)`` of a local ``func`` binds, ``model.save_pretrained(path)`` of a
    local model; "" otherwise (a parameter saved: the caller built it)."""
    name = last_name(call.callee)
    if name == "save_pretrained":
        saved = call.callee.rpartition(".")[0]
    elif name == "save_file" or call.callee == "torch.save":
        args = split_args(call.arglist)
        saved = args[0].text.strip() if args and args[0].keyword is None else ""
    else:
        return ""
    if not saved.isidentifier():
        return ""
    bound = any(saved in a.targets for a in func.assigns) or any((c.target or "").strip() == saved for c in func.calls)
    return saved if bound else ""


def receiver_class(caller: Func, callee: str, index: ProjectIndex) -> ClassInfo | None:
    """The class a call by name through a receiver ``caller`` binds itself
    (``gptq[name] = GaudiGPTQ(layer)`` ... ``gptq[name].fasterquant()``,
    round 35) constructs, every binding of it a construction of that one
    class; None otherwise (a receiver it does not bind, a member, a module)."""
    receiver = callee.rpartition(".")[0].strip()
    if not receiver or receiver.startswith("self.") or receiver == "self":
        return None
    found: ClassInfo | None = None
    for call in caller.calls:
        if (call.target or "").strip() != receiver:
            continue
        cls = index.constructed_class(caller, call)
        if cls is None or (found is not None and cls is not found):
            return None
        found = cls
    if found is None or any(receiver in a.targets for a in caller.assigns):
        return None
    return found


def other_receiver(caller: Func, callee: str, func: Func, index: ProjectIndex) -> bool:
    """``callee`` goes through a receiver ``caller`` binds to a construction
    of a class other than ``func``'s (or its bases, or its subclasses) that
    defines ``func``'s name: it runs that class's method (``receiver_class``)."""
    cls = receiver_class(caller, callee, index)
    if cls is None or func.owner is None:
        return False
    mine = {func.owner.key, *(b.key for b in index.base_classes(func.owner))}
    return cls.key not in mine and func.owner.key not in {b.key for b in index.base_classes(cls)} \
        and bool(index.method_lookup(cls, func.name))


def runs_class_method(caller: Func, callee: str, func: Func, index: ProjectIndex) -> bool:
    """``callee`` goes through a receiver ``caller`` binds to a construction
    of ``func``'s class (or a subclass not overriding it): it runs ``func``."""
    cls = receiver_class(caller, callee, index)
    return cls is not None and func.name == last_name(callee) and func in index.method_lookup(cls, func.name)


def stepped_around(caller: Func, name: str, stepping: Callable[[Call], bool]) -> bool:
    """For a run-once caller (a script's module level, a ``main``) that runs a
    step: some call of ``name`` in it sits in a loop whose body also holds a
    call ``stepping`` says runs a step (``for batch in data: loss.backward();
    ema.update(model)``). A script that quantises a model and then samples
    from it (``model = convert(model)`` ... ``model.generate(ids)``) runs
    the writer once, before its steps (round 35)."""
    loops = [b.span for b in caller.blocks if b.kind == "loop"]
    if not loops:
        return False
    mine = [c.span.line for c in caller.calls if last_name(c.callee) == name]
    steps = [c.span.line for c in caller.calls if stepping(c)]
    return any(any(loop.contains_line(m) for m in mine) and any(loop.contains_line(s) for s in steps)
               for loop in loops)


def calls_held(func: Func, callee: str, index: ProjectIndex) -> bool:
    """``callee`` is a value ``func`` holds: a parameter or local
    (``layer(x)``), or a ``self.x`` its class binds and does not define as
    a method."""
    if callee.isidentifier():
        if _CLASS_NAME.fullmatch(callee):
            return False  # a class it holds (`Cls = getattr(mod, kind)`, a local import): a construction (round 35)
        scope = func.scope
        return (scope is not None and callee in scope.params) or callee in index.bound_names(func)
    return callee.startswith("self.") and callee[5:].isidentifier() and func.owner is not None \
        and not index.method_lookup(func.owner, callee[5:]) and _held(func.owner, callee)


def _held(owner: ClassInfo, member: str) -> bool:
    """The class binds ``self.x`` somewhere (a module or callable it holds),
    not an inherited method (``self.register_buffer``)."""
    return any(member in a.targets for ms in owner.methods.values() for m in ms for a in m.assigns) or any(
        (c.target or "").strip() == member for ms in owner.methods.values() for m in ms for c in m.calls)
