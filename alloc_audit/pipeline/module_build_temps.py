"""Stage 5, after the shared fixtures: temporaries of a torch module's own
build step (issue 11, round 16).

Input: classified sites and the project index. Output: the same sites, a
few per-call (T4) temporaries re-tiered T1 with a reason naming the
constructor.

A torch module often builds its state in a method of its own that only its
constructor runs (``__init__`` -> ``self.rope_init()`` ->
``self.build_rope_cache(n)``, which registers the cache): the method's
temporaries that feed the state it keeps (the position index a cache is
computed from) are made while
the module, and so the model, is built, once: load-time temporaries, T1
(the judges' convention; DESIGN.md, "Lifetime tiers": T1 from model load to
unload; a load path's temporaries are T1). Every resolved caller of the
method, up to two calls, must be a constructor of the same class or a
method of it that only those reach; one per-step caller (``forward``
rebuilding the cache when the sequence grows) keeps it per call. The
value flows through a method of the local too (round 29: ``self.layer[i] =
weight.to(dtype)`` in a ``zero_init_`` the constructor runs). A
temporary of the constructor itself stays T4 (it dies when the constructor
returns).

A plain function does the same for a module (``precompute_freqs_cis(args)``
handed to ``self.register_buffer`` in ``Transformer.__init__``): when every
resolved caller is a torch module's constructor that keeps the call's
result (an argument of ``register_buffer`` / ``nn.Parameter``, or stored in
``self.x``), or a function only such callers reach (a helper nested in it),
its temporaries are made while the model is built: T1. So is a caller that
is a method of the module keeping the result (``self.freqs_cis =
precompute_freqs_cis(...)`` in ``Transformer.precompute_freqs_cis``) which
only the constructor reaches, as above (round 25); and what such a function
returns is the module's state, built with it: T1 too. One other caller (a
``forward`` recomputing it) keeps them per call. Round 26: a constructor
keeps the result too when it binds it to locals of which one goes on to
``Parameter`` / ``register_buffer`` / ``self.x`` (``codes, books =
find_codes(w)`` ... ``self.books = nn.Parameter(books)``: a quantised
weight built at load), and a plain function's entries of a list it makes
itself (``sums = [torch.zeros_like(c) ...]``) are its temporaries like its
locals. A ``@classmethod`` / ``@staticmethod`` builds for its callers as a
plain function does (``PositionRotary.static(cfg)`` kept in ``self.rotary``
by each model constructor calling it), and a base class's constructor
calling ``self.build()`` counts as a constructor of the subclass whose
override it runs. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..model import Call, Site, Tier
from .default_device import is_module
from .index import Func, ProjectIndex
from .names import has_name
from .retier import Decision, python_device_site, retier

_DEPTH = 2  # calls up from the method to its class's constructor
_TORCH_OP = "handed:torch."  # an argument of a torch op (`torch.polar(torch.ones_like(f), f)`): a temporary
# an entry of a local container: `sums[0]`, handed to `parts.append` (round 26)
_LOCAL_ENTRY = re.compile(r"([A-Za-z_]\w*)\[[^\]]*\]|handed:([A-Za-z_]\w*)\.(?:append|extend|insert)")
_FLOW_STEPS = 4  # assignments a temporary may flow through before it is kept


def module_build_temps(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[str, bool] = {}
    modules: dict[str, bool] = {}  # is_module's memo

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T4) and (site.kept in ("", "local", "return")
                                                      or site.kept.startswith(_TORCH_OP)
                                                      or _LOCAL_ENTRY.fullmatch(site.kept) is not None)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        entry = _LOCAL_ENTRY.fullmatch(site.kept)
        if entry is not None and (func is None or not _bound_in(func, entry.group(1) or entry.group(2))):
            return None  # an entry of a container the function does not make itself
        if func is not None and func.scope is not None and (func.scope.role == "function" or _static(func)):
            # what it returns, too: every caller keeps that on the module it builds
            ctor = _built_for_module(func, index, _DEPTH, memo)
            return (Tier.T1, (f"a load-time temporary: {func.qualname} runs only while a module is constructed "
                              f"({ctor} keeps what it returns); was: {site.tier_reason}")) if ctor else None
        if site.kept.startswith(_TORCH_OP) or site.kept == "return" or entry is not None:
            return None  # a method's: only its own locals are followed
        owner = func.owner if func is not None else None
        if func is None or func.scope is None or func.scope.role != "method" or owner is None or not (
                any(b.rsplit(".", 1)[-1].endswith("Module") for b in owner.bases)
                or is_module(index, owner.qualname, owner.bases, modules)):
            return None  # a module's method: by a base named `*Module` or one that reaches nn.Module
        if not _feeds_state(site, func) or not _built_by_constructor(func, index, _DEPTH, memo):
            return None
        return Tier.T1, (f"a load-time temporary: {func.qualname} runs only while module {owner.name} is "
                         f"constructed (its constructor calls it); was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _static(func: Func) -> bool:
    """A ``@classmethod`` / ``@staticmethod``: no object of its class is
    at hand, so it builds for its callers as a plain function does
    (``Rotary.static(cfg)`` in a model's constructor)."""
    scope = func.scope
    return scope is not None and scope.role == "method" and any(
        d.split("(", 1)[0].rsplit(".", 1)[-1] in ("classmethod", "staticmethod") for d in scope.decorators)


def _ancestor(ctor: Func, func: Func, index: ProjectIndex) -> bool:
    """``ctor``'s class is ``func``'s class or a base of it: a base
    constructor's ``self.build()`` runs the subclass's override while a
    subclass object is constructed."""
    owner, base = func.owner, ctor.owner
    return owner is not None and base is not None and (
        owner is base or any(c is base for c in index.base_classes(owner)))


def _bound_in(func: Func, name: str) -> bool:
    """``name`` is a local ``func`` binds (``sums = [...]``), not a
    parameter, a global or a member."""
    return name != "self" and (any(name in (t.strip() for t in a.targets) for a in func.assigns)
                               or any((c.target or "").strip() == name for c in func.calls))


def _feeds_state(site: Site, func: Func) -> bool:
    """The temporary is an intermediate of state the method keeps on the
    module: its local flows, through the method's assignments, into
    ``self.x = ...`` or ``self.register_buffer(...)`` (not through a host
    scalar, ``.item()``/``.tolist()``: a probe)."""
    local = (site.target or "").strip()
    if not local.isidentifier():
        return False
    names = {local}
    # a local bound to a call's value is the call's target (`x = torch.einsum(..., seq_idx).float()`: the
    # outer call of the line holds it)
    bound = {c.span.line: c.target.strip() for c in func.calls if c.target}
    flows = [(a.line, a.value, a.targets) for a in func.assigns]
    # the callee too: a method of a local (`self.layer[i] = weight.to(dtype)`) hands on the local's value
    flows += [(c.span.line, f"{c.callee}({c.arglist})", (bound[c.span.line],)) for c in func.calls
              if c.span.line in bound]
    for _ in range(_FLOW_STEPS):
        grown = False
        for line, value, targets in flows:
            if line <= site.span.line or not _mentions(value, names):
                continue
            for target in targets:
                target = target.strip()
                if target.startswith("self."):
                    return True
                if target.isidentifier() and target not in names:
                    names.add(target)
                    grown = True
        if not grown:
            break
    return any(c.callee.endswith("register_buffer") and _mentions(c.arglist, names) for c in func.calls)


def _mentions(text: str, names: set[str]) -> bool:
    return any(has_name(text, n, ".", "(") and f"{n}.item(" not in text and f"{n}.tolist(" not in text
               for n in names)


def _built_by_constructor(func: Func, index: ProjectIndex, depth: int, memo: dict[str, bool]) -> bool:
    """Every resolved caller of ``func`` is a constructor of its class, or
    (``depth`` allowing) a method of the class only those reach."""
    key = f"{func.id}@{depth}"
    found = memo.get(key)
    if found is None:
        dist = index.callers_within([func], 1)
        callers = [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]
        found = bool(callers) and all(
            c.scope is not None and (
                (c.scope.role == "constructor" and _ancestor(c, func, index))
                or (c.owner is func.owner and c.scope.role == "method" and depth > 1
                    and _built_by_constructor(c, index, depth - 1, memo)))
            for c in callers)
        memo[key] = found
    return found


def _built_for_module(func: Func, index: ProjectIndex, depth: int, memo: dict[str, bool]) -> str:
    """The constructor that keeps ``func``'s result on a torch module, when
    every resolved caller is one (or, ``depth`` allowing, a function only
    such callers reach, or a method of the module that keeps the result and
    that only its constructor reaches: ``self.freqs_cis = precompute_freqs_cis(...)``
    in ``Transformer.precompute_freqs_cis``, which ``__init__`` calls); "" otherwise."""
    dist = index.callers_within([func], 1)
    callers = [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]
    found = ""
    for c in callers:
        role = c.scope.role if c.scope is not None else ""
        if role == "constructor" and _module(c) and _keeps_result(c, func.name):
            found = found or c.qualname
        elif role == "function" and depth > 1 and c is not func and (
                via := _built_for_module(c, index, depth - 1, memo)):
            found = found or via
        elif role == "method" and _module(c) and _keeps_result(c, func.name) \
                and _built_by_constructor(c, index, _DEPTH, memo):
            found = found or c.qualname
        else:
            return ""
    return found


def _module(func: Func) -> bool:
    owner = func.owner
    return owner is not None and any(b.rsplit(".", 1)[-1].endswith("Module") for b in owner.bases)


def _keeps_result(ctor: Func, name: str) -> bool:
    """Each call of ``name`` in ``ctor`` is kept on the module: stored in
    ``self.x`` or handed to ``register_buffer`` / ``Parameter``, or (round
    26) bound to locals of which one is kept so below (``codes, books =
    init_codes(w)`` ... ``self.books = nn.Parameter(books)``)."""
    calls = ctor.calls_of(name)
    kept = [c for c in ctor.calls if c.callee.endswith(("register_buffer", "Parameter"))]
    return bool(calls) and all(
        (c.target or "").strip().startswith("self.")
        or any(k.span.contains_line(c.span.line) and has_name(k.arglist, name, ".") for k in kept)
        or _locals_kept(ctor, c.target or "", c.span.line, kept)
        for c in calls)


def _locals_kept(ctor: Func, target: str, line: int, kept: Sequence[Call]) -> bool:
    """One of the locals ``target`` binds (``codes, books``) on ``line`` is
    handed below to ``register_buffer`` / ``Parameter`` or stored in
    ``self.x`` as part of the value, by the constructor itself."""
    names = [n for n in (t.strip().lstrip("*") for t in target.split(",")) if n.isidentifier()]
    if not names:
        return False
    return any(k.span.line > line and has_name(k.arglist, n, ".") for k in kept for n in names) or any(
        a.line > line and any(t.strip().startswith("self.") for t in a.targets) and has_name(a.value, n, ".")
        for a in ctor.assigns for n in names)
