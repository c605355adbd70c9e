"""Stage 5, after the callers' tiers: module state is model-resident
(issue 11, round 8; the judges' convention: registered buffers and
parameters are T1, like weights).

A device buffer of a constructor or a function (T2 or T4 so far) is T1 when
it becomes a module's registered state:

- handed to a ``*_parameter*`` helper
  (``create_sharded_parameter_from_config(parameter=torch.ones(n))``);
- made into a local by an expression (``scale = (torch.arange(n) + b) / c
  if base else None``) that is then registered (``self.register_buffer(
  "scale", scale)``, ``nn.Parameter(scale)``), whole or a slice of it
  (``nn.Parameter(weight[lo:hi])``: one contiguous buffer split into
  parameters); so is a member the function makes and registers slices of
  (``self.lookup = torch.zeros(n)`` ... ``self.register_buffer(name,
  self.lookup[offsets[i] : offsets[i + 1]])`` in a loop);
- held in a local that then replaces a module's weight whole
  (``linear.weight.data = x``, ``param.data = x.data``);
- held in a local passed to a project class's constructor
  (``FlashSelfAttention(alibi_slopes=slopes)``, or through
  ``partial(FlashSelfAttention, alibi_slopes=slopes)``) whose ``__init__``
  registers that parameter.

Round 25: the registered value may hold the allocation anywhere inside it
(``self.register_buffer("r", torch.arange(0, d, 2)[: d // 2].float() / d)``,
``nn.Parameter(x if x is not None else torch.ones(n) * v)``): made for the
module's state, T1. An allocation handed whole to a project class's
constructor that wraps that parameter (``nn.Parameter(scales.data)``) is T1
as a local so handed is, and a parameter class named for it
(``bmt.DistributedParameter(w)``) registers like ``nn.Parameter``. A
temporary of module construction (a constructor, or a method every call by
whose name sits in a constructor) whose value flows through the function's
later assignments, up to ``_FLOW_HOPS`` locals, into a registration
(round 31: or a temporary of a set-up method, T2 as an initialiser's, that so flows)
(``t`` -> ``freqs = torch.outer(t, inv)`` -> ``register_buffer("cos",
freqs.cos())``) is made while the model is built: a load-path temporary, T1
(the judges' convention). A temporary only read (its shape, a host scalar)
or stored in a plain ``self.x`` stays as it was, and none of this applies to
an object ``built_per_call`` found built per call.

Round 26: a value a function (no constructor) returns (itself, moved or
viewed; not a value computed from it, nor a mask indexing it), whole or as
one element of a returned tuple, to calls that
each resolve to it and each register that value on a module
(``self.register_buffer("f", sinc_filter(n))``, ``q, k = self._caches()``
... ``self.register_buffer("q", q)``) is made for module state: T1. One
caller keeping it as a plain attribute, or an unresolved call by its name,
leaves it alone.

Round 35: ``nn.ParameterList`` / ``nn.ParameterDict`` register too (they wrap
each plain tensor they are given in an ``nn.Parameter``):
``nn.ParameterList([w.new_zeros(n) for _ in range(r)])`` in a constructor is T1.

One call edge is followed, from the calls of the site's own function (or,
for a returned value, from the calls that reach it): no search. It runs
after classification, so the index still sees these allocations as the
constructor's and a class that holds them stays a derived site (``derive`` then gives it T1 from its allocation). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import argument_for, split_args
from ..model import Call, Language, Site, Tier
from .index import ClassInfo, Func, ProjectIndex
from .index.values import rebound_between
from .lifetimes import weight_storage
from .names import IDENTIFIER, has_word
from .retier import Decision, python_device_site, retier

_PARTIAL = frozenset({"partial", "functools.partial"})
# `nn.Parameter` and the parameter classes named for it (`bmt.DistributedParameter(w)`)
REGISTERS = re.compile(r"(?:^|\.)(?:register_buffer|register_parameter|(?:[A-Z]\w*)?Parameter|Parameter(?:List|Dict))$"
                       r"|_parameter(?:_|$)")
_ON_MODULE = re.compile(r"(?:^|\.)register_(?:buffer|parameter)$")
# puts its argument on a module
_STATE = re.compile(r"(?:^|\.)(?:register_(?:buffer|parameter)|(?:[A-Z]\w*)?Parameter|Parameter(?:List|Dict))$")
_MEMBER = re.compile(r"self\.[A-Za-z_]\w*")  # a member the same function registers slices of
# moves and casts whose result is the same values (`data.to(device)`, `w.contiguous()`); a `clone()` is
# a copy: the parameter is the clone, not the local
_BOUND = r"(?:[^\[\]()]|\[[^\[\]()]*\])*"  # a slice bound: no call, one level of subscripts
_SAME = r"to|cuda|contiguous|detach|float|half|bfloat16|view|reshape|t"
_FLOW_HOPS = 4  # locals a construction temporary's value may pass through on its way to a registration
_SHAPE_ONLY = re.compile(r"(?:_like|\bnew_\w+)\(\s*$")  # a `*_like(x)` / `y.new_zeros(x` reads x's shape
# round 31: a set-up method (the classifier's initialiser, T2) registering state builds the module too
# (`setup_cache`: `ones = torch.ones(n, n)` -> `register_buffer("mask", torch.tril(ones))`)
_SET_UP = re.compile(r"initialiser ")
_PER_CALL = "per call:"  # built_per_call's reasons: a module built per call keeps its state per call


def module_state(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    registering = _Registrations(index)  # per function: its registering calls, in order (issue 11)
    reaching: dict[str, list[tuple[Func, Call]]] = {}  # per function: the calls reaching it, when all may register

    def decide(site: Site) -> Decision | None:
        if site.wrapper and REGISTERS.search(site.wrapper):
            return Tier.T1, f"module state: handed to {site.wrapper} in {site.scope}; was: {site.tier_reason}"
        func = index.func(site.path, site.scope)
        if func is None:
            return None
        if not site.tier_reason.startswith(_PER_CALL):  # an object built per call keeps its state per call
            inside = _inside_registration(site, func, _registering(func, registering))
            if inside is not None:
                return Tier.T1, (f"module state: made inside the value {inside.callee} registers in {site.scope}; "
                                 f"was: {site.tier_reason}")
        made = _expression_local(site, func)
        local = made or (site.target or "")
        call = _registration_of(func, _registering(func, registering), local, site.span.end_line) \
            if IDENTIFIER.fullmatch(local) or _MEMBER.fullmatch(local) else None
        if call is not None:
            how = f"{made} (made from it)" if made else local
            return Tier.T1, (f"module state: {how} is registered by {call.callee} in {site.scope}; "
                             f"was: {site.tier_reason}")
        if not site.tier_reason.startswith(_PER_CALL) and IDENTIFIER.fullmatch(local):
            flow = _flows_into_registration(func, _registering(func, registering), local,
                                            site.stmt_line or site.span.line)
            if flow is not None and (_builds_module(func, index) or _SET_UP.match(site.tier_reason)):
                call, chain = flow
                return Tier.T1, (f"module state: a temporary of module construction ({site.scope}) whose value "
                                 f"flows through {' -> '.join(chain)} into {call.callee}; was: {site.tier_reason}")
            kept = _returned_registered(func, local, site.stmt_line or site.span.line,
                                        _registering_callers(func, index, registering, reaching), registering)
            if kept:
                return Tier.T1, (f"module state: {site.scope} returns {local} to callers that each register it "
                                 f"({kept}); was: {site.tier_reason}")
        if made:
            return None
        stored = _stored_as_weight(func, local, site.span.end_line) if IDENTIFIER.fullmatch(local) else ""
        if stored:
            return Tier.T1, f"module state: {local} becomes {stored} in {site.scope}; was: {site.tier_reason}"
        found = _registered_by(site, func, index, registering)
        if found is None:
            return None
        ctor, call = found
        owner = ctor.owner.name if ctor.owner else ctor.qualname
        return Tier.T1, (f"module state: handed to {owner}, whose constructor registers it ({call.callee} at "
                         f"{ctor.path}:{call.span.line}); was: {site.tier_reason}")

    return retier(sites, lambda s: python_device_site(s, Tier.T2, Tier.T4), decide)


def _builds_module(func: Func, index: ProjectIndex) -> bool:
    """``func`` runs while its object is built: a constructor, or a method
    every call by its name (resolved to it or to nothing) sits in a constructor."""
    if func.scope is None or func.scope.role == "constructor":
        return func.scope is not None
    if func.scope.role != "method":
        return False
    reaching = index.calls_reaching(func)
    return bool(reaching) and all(c.scope is not None and c.scope.role == "constructor" for c, _, _ in reaching)


def _carries(text: str, local: str) -> bool:
    """``text`` reads the values of ``local``: not only its shape, size,
    device or dtype (``x.shape``, ``torch.zeros_like(x)``), not an attribute ``y.x``."""
    pattern = rf"(?<![\w.]){re.escape(local)}\b(?!\s*\.\s*(?:shape|size|numel|device|dtype|ndim|dim)\b)"
    return any(_SHAPE_ONLY.search(text, 0, m.start()) is None for m in re.finditer(pattern, text))


def _flows_into_registration(func: Func, registering: list[Call], local: str,
                             after: int) -> tuple[Call, list[str]] | None:
    """The registration (``register_buffer``/``register_parameter``/a parameter) that
    takes a value computed from ``local`` through the function's later
    assignments (``t`` -> ``freqs = torch.outer(t, inv)`` -> ``register_buffer("cos", freqs.cos())``),
    up to ``_FLOW_HOPS`` locals, with the chain of locals; or None."""
    calls = [c for c in registering if c.span.line > after and _STATE.search(c.callee)]
    if not calls:
        return None
    chain = _chain(func, local, after)
    for call in calls:
        if any(_carries(call.arglist, n) for n in chain):
            return call, chain
    return None


def _chain(func: Func, local: str, after: int) -> list[str]:
    """``local`` and the locals the function's assignments after line
    ``after`` compute from it, up to ``_FLOW_HOPS`` of them."""
    # a value is an assignment's (`freqs = t[:, None] * inv`) or a call's stored whole (`freqs = torch.outer(t, inv)`)
    steps = [(a.line, a.targets, a.value) for a in func.assigns if a.line > after and a.op == "="]
    steps += [(c.span.line, (c.target,), f"{c.callee}({c.arglist})") for c in func.calls
              if c.target and c.span.line > after]
    chain = [local]
    for _, targets, value in sorted(steps, key=lambda step: step[0]):
        if len(chain) > _FLOW_HOPS:
            break
        if not any(_carries(value, n) for n in chain):
            continue
        for target in targets:
            for name in (t.strip() for t in target.split(",")):
                if IDENTIFIER.fullmatch(name) and name not in chain:
                    chain.append(name)
    return chain


def _registering_callers(func: Func, index: ProjectIndex, registering: _Registrations,
                         memo: dict[str, list[tuple[Func, Call]]]) -> list[tuple[Func, Call]]:
    """The calls that reach ``func`` (no constructor, returning a value), when
    each resolves to it and sits in a function that registers something;
    else none. Once per function."""
    found = memo.get(func.id)
    if found is None:
        found = []
        if func.scope is not None and func.scope.role != "constructor" and func.returns:
            calls = index.calls_reaching(func)
            if all(resolved and _registering(caller, registering) for caller, _, resolved in calls):
                found = [(caller, call) for caller, call, _ in calls]
        memo[func.id] = found
    return found


def _returned_registered(func: Func, local: str, after: int, reaching: list[tuple[Func, Call]],
                         memo: _Registrations) -> str:
    """``func`` (no constructor) returns the value of ``local`` (itself, moved
    or viewed; one element of a returned tuple, by position) and
    every call that reaches it (``reaching``: each resolved to it) registers that value on
    a module (``self.register_buffer("f", helper(n))``, ``a, b =
    self._caches()`` ... ``self.register_buffer("b", b)``): made for
    module state. Where (the callers' registrations), or ""."""
    if not reaching:
        return ""
    position: int | None = None
    returned = False  # some return after the allocation carries it (every one does)
    for ret in func.returns:
        if ret.line <= after:
            continue
        if rebound_between(func, local, after, ret.line, lambda value: _continues(value, local)):
            return ""  # what is returned is a later value of the name, not this allocation
        elements = [a.text.strip() for a in split_args(ret.value)]
        carrying = [i for i, e in enumerate(elements) if _takes(e, local, False)]
        if len(carrying) != 1:
            return ""
        at = carrying[0] if len(elements) > 1 else None
        if returned and at != position:
            return ""
        position, returned = at, True
    if not returned:
        return ""
    where = []
    for caller, call in reaching:
        registering = _registering(caller, memo)
        found = next((r for r in registering if r is not call and r.span.contains(call.span)
                      and _STATE.search(r.callee)), None)
        names = [t.strip("() ") for t in _bound_to(caller, call).split(",")]
        name = names[position] if position is not None and len(names) > position else \
            names[0] if position is None and len(names) == 1 else ""
        if found is None and IDENTIFIER.fullmatch(name):  # the local itself (moved, cast), not what is computed from it
            found = _registration_of(caller, registering, name, call.span.end_line)
        if found is None:
            return ""
        where.append(f"{found.callee} at {caller.path}:{found.span.line}")
    return ", ".join(where[:3])


def _continues(value: str, local: str) -> bool:
    """``value`` is ``local`` itself indexed, moved, cast or reshaped
    (``inv_freq[keep]``, ``x.float().contiguous()``): the same values flow on
    into what is returned; arithmetic or another call (``torch.round(x / s)``,
    ``q / q.norm()``) makes a new value."""
    return re.fullmatch(re.escape(local) + r"(?:\[[^\[\]]*\]|\.\w+\([^()]*\))*", value) is not None


def _bound_to(func: Func, call: Call) -> str:
    """What the call's result is bound to: its target, or the targets of the
    assignment whose value is the call (``a, b = (self.make())``), or ""."""
    if call.target:
        return call.target
    whole = re.compile(r"[\s(]*" + re.escape(call.callee) + r"\(.*\)[\s)]*", re.S)
    for a in func.assigns:
        if a.op == "=" and a.line <= call.span.line <= a.line + 3 and whole.fullmatch(a.value):
            return ",".join(a.targets)
    return ""


def _inside_registration(site: Site, func: Func, registering: list[Call]) -> Call | None:
    """The registering call (``self.register_buffer(name, torch.arange(n)[:k].float() / n)``,
    ``nn.Parameter(torch.ones(n) * v)``) one of whose arguments holds the site inside an
    expression, deeper than the direct argument ``decide`` reads by ``wrapper``, or None."""
    for call in registering:
        if call.span != site.span and call.span.contains(site.span) and _STATE.search(call.callee):
            return call
    return None


def _expression_local(site: Site, func: Func) -> str:
    """The local an expression of the allocation is assigned to, when the
    allocation is not the whole right-hand side (no ``target``)."""
    if site.target:
        return ""
    line = site.stmt_line or site.span.line
    for a in func.assigns:
        if a.line == line and a.op == "=" and len(a.targets) == 1 and IDENTIFIER.fullmatch(a.targets[0].strip()):
            return a.targets[0].strip()
    # `data = w.to(device).full_tensor()`: the outer call holds the target
    for c in func.calls:
        if c.span.line == line and c.target and IDENTIFIER.fullmatch(c.target.strip()):
            return c.target.strip()
    return ""


class _Registrations:
    """Per function, its calls that may register, looked up once; and per
    method, the argument it stores as module state (round 31)."""

    __slots__ = ("index", "calls", "stores")

    def __init__(self, index: ProjectIndex) -> None:
        self.index = index
        self.calls: dict[str, list[Call]] = {}
        self.stores: dict[str, tuple[int, str, str] | None] = {}


def _registering(func: Func, memo: _Registrations) -> list[Call]:
    """The function's calls that may register (``REGISTERS``), in order: looked up once per function, not per site.
    Round 31: a call of a project method of the function's class (or a base) that stores one of its
    arguments as module state (``self.register("z", z, lr=lr)``, ``OptimModule.register`` calling
    ``self.register_buffer(name, tensor)``) counts as that registration of the argument it stores:
    ``self.register -> self.register_buffer(z)``."""
    found = memo.calls.get(func.id)
    if found is None:  # by the callees' column: most functions register nothing, and their calls stay unbuilt
        registers = any(REGISTERS.search(callee) for callee in func.callees)
        found = [c for c in func.calls if REGISTERS.search(c.callee)] if registers else []
        owner = func.owner
        if owner is not None and func.language is Language.PYTHON and any(
                c.startswith("self.") and c.count(".") == 1 and not REGISTERS.search(c) for c in func.callees):
            wrapped = [w for c in func.calls if (w := _wrapped(c, owner, memo)) is not None]
            if wrapped:
                found = sorted(found + wrapped, key=lambda c: (c.span.line, c.span.col))
        memo.calls[func.id] = found
    return found


def _wrapped(call: Call, owner: ClassInfo, memo: _Registrations) -> Call | None:
    """``self.m(..., t, ...)`` where ``m`` (a method of the class or of a base) stores the parameter
    in ``t``'s place as module state: that registration of ``t`` (its argument text alone), or None."""
    name = call.callee[5:] if call.callee.startswith("self.") else ""
    if not IDENTIFIER.fullmatch(name) or REGISTERS.search(call.callee):
        return None
    methods = memo.index.method_lookup(owner, name)
    if len(methods) != 1:
        return None
    stores = _stores(methods[0], memo)
    if stores is None:
        return None
    position, param, how = stores
    arg = argument_for(split_args(call.arglist), param, position)
    if arg is None or arg.text.strip().startswith("*"):
        return None
    return Call(call.scope, call.span, f"{call.callee} -> {how}", arg.text.strip(), call.target)


def _stores(method: Func, memo: _Registrations) -> tuple[int, str, str] | None:
    """The parameter a method stores as module state on its object (its position after ``self``,
    its name, and how: ``self.register_buffer(name, tensor)``, ``self.register_parameter(name,
    nn.Parameter(tensor))``, ``setattr(self, name, nn.Parameter(tensor))``), or None. Once per method."""
    if method.id in memo.stores:
        return memo.stores[method.id]
    found: tuple[int, str, str] | None = None
    scope = method.scope
    params = [p for p in scope.params if p not in ("self", "cls")] if scope is not None and scope.role == "method" \
        else []
    for call in method.calls if params and scope is not None and scope.params[:1] == ("self",) else ():
        on_self = call.callee in ("self.register_buffer", "self.register_parameter")
        if not on_self and call.callee != "setattr":
            continue
        args = [a.text.strip() for a in split_args(call.arglist)]
        if len(args) < (3 if call.callee == "setattr" else 2) or (not on_self and args[0] != "self"):
            continue
        value = args[2] if call.callee == "setattr" else args[1]
        wrapped = re.fullmatch(r"(?:[\w.]+\.)?(?:[A-Z]\w*)?Parameter\((.*)\)", value, re.S)
        if call.callee == "setattr":
            if wrapped is None:
                continue  # a plain attribute is no registration
            value = split_args(wrapped.group(1))[0].text.strip() if wrapped.group(1).strip() else ""
        elif wrapped is not None:
            value = split_args(wrapped.group(1))[0].text.strip() if wrapped.group(1).strip() else ""
        for i, p in enumerate(params):
            if _takes(value, p, False) and not rebound_between(method, p, 0, call.span.line, lambda v: False):
                how = "self.register_buffer" if call.callee == "self.register_buffer" else "self.register_parameter"
                found = (i, p, how)
                break
        if found is not None:
            break
    memo.stores[method.id] = found
    return found


def _registration_of(func: Func, registering: list[Call], local: str, after: int) -> Call | None:
    """The first registration (of ``registering``, the function's calls that
    register) after line ``after`` that takes ``local``, whole or moved or
    cast (``nn.Parameter(data.to(device))``), or converted by one call
    (``nn.Parameter(to_nf4(weight))``; not a ``*_like`` of it, which takes
    its shape only)."""
    for call in registering:
        if call.span.line > after and local in call.arglist \
                and any(_takes(a.text.strip(), local, _on_module(func, call)) for a in split_args(call.arglist)):
            return call
    return None


def _on_module(func: Func, call: Call) -> bool:
    """The registration puts it on a module: ``register_parameter``/``register_buffer``,
    stored to an attribute, or inside one of those."""
    return (bool(_ON_MODULE.search(call.callee)) or "." in (call.target or "")
            or any(c is not call and _ON_MODULE.search(c.callee) and c.span.contains(call.span) for c in func.calls))


def _takes(arg: str, local: str, on_module: bool) -> bool:
    """``arg`` is ``local`` or a slice of it, moved or cast, or (on a module) converted by one
    call (compiled only for the few registrations that name the local)."""
    # a basic slice or an integer index is a view of the same storage (`nn.Parameter(w[lo:hi])`, the
    # split parameters of one contiguous buffer); an index by a tensor or a list is a copy
    # (bounds may index a list themselves: `storage[offsets[i] : offsets[i + 1]]`)
    whole = re.escape(local) + r"(?:\[(?:" + _BOUND + ":" + _BOUND + r"|\s*-?\d+\s*)\])?(?:\.(?:" + _SAME + \
        r")\([^()]*\)|\.data)*"
    # converted first (`nn.Parameter(to_nf4(weight))`): its values become the parameter's
    converted = r"(?![\w.]*(?:_like|\bnew_\w+)\()[A-Za-z_][\w.]*\(\s*" + whole + r"\s*(?:,[^()]*)?\)"
    return re.fullmatch(whole, arg) is not None or (on_module and re.fullmatch(converted, arg) is not None)


def _stored_as_weight(func: Func, local: str, after: int) -> str:
    """The module weight ``local`` replaces after line ``after``, whole
    (``linear.weight.data = x``, ``layer.bias = b``, ``p.data = x.data``), or ""."""
    for a in func.assigns:
        if a.line > after and a.op == "=" and len(a.targets) == 1 and a.value.strip() in (local, f"{local}.data") \
                and weight_storage(a.targets[0].strip()):
            return a.targets[0].strip()
    return ""


def _first_taking(func: Func, local: str, after: int) -> Call | None:
    """The first call after line ``after`` that takes ``local`` whole as an argument."""
    # an argument that is the name is a whole word of the argument text: the others are not split
    word = all(ch.isalnum() or ch == "_" for ch in (local[:1], local[-1:]))  # `\b` at both ends
    for call in func.calls:
        if call.span.line > after and local in call.arglist and (not word or has_word(call.arglist, local)) \
                and any(a.text.strip() == local for a in split_args(call.arglist)):
            return call
    return None


def _registered_by(site: Site, func: Func, index: ProjectIndex,
                   registering: _Registrations) -> tuple[Func, Call] | None:
    """The constructor (and its registering call) of the class the site's
    local is handed to, when that constructor registers the parameter."""
    local = site.target or ""
    if not site.wrapper:
        return None
    if local.isidentifier():
        call = _first_taking(func, local, site.span.end_line)
    elif site.wrapper.rsplit(".", 1)[-1][:1].isupper():
        # itself the argument of a class's construction (`ScaledActivation(act, torch.ones(c))`)
        call, local = _argument_of(site, func)
    else:
        return None
    if call is None or call.callee != site.wrapper:
        return None
    args = list(split_args(call.arglist))
    cls = call.callee
    if cls in _PARTIAL and args and args[0].keyword is None:
        cls, args = args[0].text.strip(), args[1:]
    at = next((i for i, a in enumerate(args) if a.text.strip() == local), None)
    if at is None:
        return None
    for ctor in index.resolve(func, cls):
        if ctor.scope is None or ctor.name != "__init__":
            continue
        params = [p for p in ctor.scope.params if p not in ("self", "cls")]
        name = args[at].keyword or (params[at] if at < len(params) else "")
        for inner in _registering(ctor, registering) if name else ():
            if any(_takes(a.text.strip(), name, False)
                                                      for a in split_args(inner.arglist)):
                return ctor, inner
    return None


def _argument_of(site: Site, func: Func) -> tuple[Call | None, str]:
    """The call (named by the site's ``wrapper``) the allocation is a whole
    argument of, and that argument's text; (None, "") when it is no whole argument."""
    own = next((c for c in func.calls if c.span == site.span), None)
    if own is None or not own.arglist.strip():
        return None, ""
    for call in func.calls:
        if call.callee == site.wrapper and call is not own and call.span.contains(site.span):
            # the argument that is the allocation's call: its own arguments, then nothing after them
            found = [a.text.strip() for a in split_args(call.arglist)
                     if a.text.strip().endswith(f"({own.arglist.strip()})")
                     and re.fullmatch(r"[A-Za-z_][\w.]*\(.*\)", a.text.strip(), re.S) is not None]
            return (call, found[0]) if len(found) == 1 else (None, "")
    return None, ""
