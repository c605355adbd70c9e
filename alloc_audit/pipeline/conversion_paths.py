"""Stage 5, after ``reset_members``: device buffers made only while weights
are converted offline take the load tier, T1 (issue 11, round 23).

A checkpoint converter or exporter (``convert_exl2.py`` driving
``exllamav2/conversion/``; ``auto_round/export/``) quantises, packs or
rewrites the weights once, outside any serving or training step. The judges'
convention: device temporaries made only on a load or weight-preparation path
(checkpoint conversion, export packing, weights packed at load) take T1, the
tier of the weights they make, however often the converter loops over layers.

A function is on a conversion path when every way into it comes from one:

- a conversion module is a file whose path names a converter or exporter: a
  folder or file name whose first ``_`` word is ``convert``, ``conversion``
  or ``export`` (``[callers] converter`` in ``rules/tiers.toml``;
  ``conversion/``, ``export_to_gguf/``, ``convert_exl2.py``; not
  ``emotion_conversion/``, nor a data pipeline's ``converters.py``);
- a function of a conversion module is on the path when each of its callers
  is (none: the converter's own entry points, run by its script);
- a function elsewhere is on the path when it has callers, each on the path
  or named like a load path (rules/tiers.toml ``[callers] load``:
  ``_pack_weight_*``), and at least one is a converter (load paths alone
  are ``classify_callers``' question), up to ``_DEPTH`` calls up;
- a method's callers include the calls by its name through another object
  that resolve nowhere (``qlayer.pack(layer, scale)`` in an exporter reaches
  ``QuantLinear.pack``), so a method some step also calls by name is not;
  except for a class a conversion module defines whose every construction
  is on the path (round 24: ``AdaptiveGPTQ``, built only by the converter's
  ``quant``/``measure``): no object of it exists elsewhere, so a call by the
  same name on another object (``config.prepare()``) runs another method;
- an offline quantiser's entry is a root like a converter (round 24, the
  judges' convention: offline quantisation is weight preparation, even in
  its per-block loop): a method ``quantize`` of a class that also defines
  ``save_quantized`` (``[callers] quantiser``: it quantises the model's
  weights once and saves them; AutoGPTQ's, AutoAWQ's wrappers), unless a
  per-step function calls it. A closure it registers as a hook runs in the
  calibration forward, whose temporaries stay per call (T4), and so does
  what only the hook reaches; below an entry, a tensor move (``.to``,
  ``.cuda``) keeps its tier too, since what is moved may be calibration
  data on its way into that forward; factories there (scratch, zero
  points, losses, the quantised weight) are weight preparation;
- a function a decorator registers (``@f.register(T)``), or one outside
  the converter that its file hands on as a value (``TABLE[key] = fn``),
  has callers nobody can list: not on it;
- a nested function or lambda is on the path of the function it sits in;
  test code calling it (exercising the converter) does not count, and a
  per-step function (``forward``, ``generate``) anywhere on the way rules it
  out.

Its direct Python device sites tiered T2 or T4 become T1 with a reason naming
the conversion module or the root, except those of a forward (round 34, the
judges' convention: a forward's temporaries are per call, T4, like a
calibration forward's), which keep their tier (``runs_forward``,
``fed_to_step``): the sites of a function that traces or exports a graph
(``torch.jit.trace``, ``torch.onnx.export``, ``torch.export.export``: it runs
the model on the example inputs it makes), of a test function (``test``,
``test_*``: an inference test of what was exported), and a local handed as
it is to a per-step call (``model.generate(tokens)``: a sample run of the
converted model). A module's move there still uploads weights (T1). Work inside a
calibration or tuning loop that no such root reaches keeps its tier.
Derived sites, native code and tests are left alone. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..globs import matcher, test_path
from ..model import Language, Site, Tier
from .hook_closures import registered_closure
from .index import Func, ProjectIndex
from .move_apis import MODULE_MOVES, TENSOR_MOVES
from .retier import Decision, python_device_site, retier

_OFFLINE = "which quantises the weights offline"  # the reason a quantiser's entry gives (``_entry``)
_DEPTH = 4  # calls up from a function outside a conversion module to one inside (or a load root)
# graph tracers and exporters, by their last two names: each runs the model on example inputs
_GRAPH_CALLS = frozenset({"jit.trace", "jit.trace_module", "jit.script", "onnx.export", "onnx.dynamo_export",
                          "export.export", "_dynamo.export"})
_CALLABLE = frozenset({"function", "method", "lambda"})
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "no_grad", "inference_mode", "wraps", "lru_cache",
                               "cache", "jit", "script", "compile", "contextmanager"})


@dataclass
class _Ctx:
    index: ProjectIndex
    load: Callable[[str], bool]
    per_step: Callable[[str], bool]
    words: frozenset[str]  # rules/tiers.toml [callers] converter
    quantisers: tuple[tuple[Callable[[str], bool], Callable[[str], bool]], ...] = ()  # [callers] quantiser
    memo: dict[str, str | None] = field(default_factory=dict)
    modules: dict[str, bool] = field(default_factory=dict)
    handed: dict[str, bool] = field(default_factory=dict)  # function id -> `_handed_on`
    said: dict[str, tuple[str | None] | Func] = field(default_factory=dict)  # caller id -> `_caller_says`
    callers: dict[tuple[str, bool], list[Func]] = field(default_factory=dict)  # (id, by_name) -> `_callers`
    named: dict[str, list[Func]] = field(default_factory=dict)  # a method's name -> `called_by_name`


def conversion_paths(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    ctx = _Ctx(index, matcher(globs.load) if globs.load else (lambda _: False),
               matcher(globs.per_step) if globs.per_step else (lambda _: False), frozenset(globs.converter),
               tuple((matcher([entry]), matcher([saver])) for entry, _, saver in
                     (pair.partition(":") for pair in globs.quantiser) if saver))

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T2, Tier.T4) and not test_path(site.path)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None:
            return None
        outer = outermost(func, index)
        root = _on_path(outer, ctx, _DEPTH, frozenset())
        if root is None or (_OFFLINE in root and site.api in TENSOR_MOVES):
            return None  # a quantiser's move may carry calibration data into a calibration forward (T4)
        if site.api not in MODULE_MOVES and (runs_forward(func) or (outer is not func and runs_forward(outer))
                                             or fed_to_step(site, func, ctx.per_step)):
            return None  # a traced graph's example inputs, an inference test's, a generate's: a forward's (T4)
        return Tier.T1, (f"weight conversion: {site.scope} runs only while weights are converted or packed "
                         f"offline ({root}), a load-tier temporary; was: {site.tier_reason}")
    return retier(sites, eligible, decide)


def runs_forward(func: Func) -> bool:
    """A function that runs a forward rather than preparing weights: a test
    (``test``, ``test_*``: an inference test of the exported model) or one
    that traces or exports a graph (``torch.jit.trace``, ``torch.onnx.export``,
    ``_GRAPH_CALLS``), which runs the model on the example inputs it makes."""
    if func.name == "test" or func.name.startswith("test_"):
        return True
    table = func.table
    return table is not None and any(
        ".".join(table.callees[i].rsplit(".", 2)[-2:]) in _GRAPH_CALLS for i in func.call_ix)


def fed_to_step(site: Site, func: Func, per_step: Callable[[str], bool]) -> bool:
    """The site's local is handed, as it is, to a per-step call of the same
    function (``tokens = tokens.to("cuda")`` then ``model.generate(tokens)``:
    a sample run of the converted model): a forward's input."""
    target, table = site.target, func.table
    if not target or not target.isidentifier() or table is None:
        return False
    return any(per_step(table.callees[i].rsplit(".", 1)[-1]) and target in table.arglists[i]
               and any(a.text == target for a in split_args(table.arglists[i])) for i in func.call_ix)


def conversion_module(path: str, words: frozenset[str]) -> bool:
    """A folder or file named for a converter or exporter: its name's first word is one of ``words``."""
    parts = path.split("/")
    names = [*parts[:-1], parts[-1].rsplit(".", 1)[0]]
    return any(next((w for w in name.lower().split("_") if w), "") in words for name in names)


def outermost(func: Func, index: ProjectIndex) -> Func:
    """The function or method a nested function or lambda sits in."""
    parts = func.qualname.split(".")
    for n in range(1, len(parts)):
        outer = index.func(func.path, ".".join(parts[:n]))
        if outer is not None and outer.scope is not None and outer.scope.role in _CALLABLE:
            return outer
    return func


def _on_path(func: Func, ctx: _Ctx, depth: int, seen: frozenset[str]) -> str | None:
    """Why every way into ``func`` is a conversion path (the module or the
    root), or None. Inside a conversion module the callers are followed
    ``depth`` calls up, then the module speaks for the rest."""
    key = f"{func.id}#{depth}"
    if key in ctx.memo:
        return ctx.memo[key]
    if ctx.per_step(func.name) or func.scope is None or func.scope.role not in _CALLABLE:
        return None
    inside = _module(func.path, ctx)
    if decorator_registered(func) or (not inside and _handed_on(func, ctx)):
        return None
    if func.id in seen:
        return func.path if inside else None  # a cycle adds no way in
    built = _built_on_path(func, ctx, depth, seen | {func.id})
    callers = [c for c in _callers(func, ctx, built is None) if not test_path(c.path)] if depth > 0 else []
    found: str | None
    if built is not None and not callers:
        found = built  # its objects exist only there: the converter calls it, through them
    elif inside:
        ok = all(_caller_on_path(c, ctx, depth - 1, seen | {func.id}) is not None for c in callers)
        found = func.path if ok else None
    elif not callers or depth <= 1:
        found = None
    else:
        roots = [_caller_on_path(c, ctx, depth - 1, seen | {func.id}) for c in callers]
        named = sorted({r for r in roots if r})  # a load root alone ("") is no converter
        found = None if any(r is None for r in roots) or not named else ", ".join(named[:2])
    ctx.memo[key] = found
    return found


def _caller_on_path(caller: Func, ctx: _Ctx, depth: int, seen: frozenset[str]) -> str | None:
    # what the caller itself says is a question of the caller alone, asked again by each
    # callee and depth the walk reaches it from: answered once per caller
    said = ctx.said.get(caller.id)
    if said is None:
        said = ctx.said[caller.id] = _caller_says(caller, ctx)
    if isinstance(said, Func):
        return _on_path(said, ctx, depth, seen)
    return said[0]


def _caller_says(caller: Func, ctx: _Ctx) -> tuple[str | None] | Func:
    """The caller's answer (a 1-tuple), or the function whose way in answers for it."""
    if ctx.per_step(caller.name):
        return (None,)
    if ctx.load(caller.name) and not caller.name.startswith(("test_", "_test_")):
        return ("",)  # weight preparation too (`_pack_weight_*`): it does not rule the path out
    if caller.qualname == "<module>":
        return (caller.path if _module(caller.path, ctx) else None,)
    outer = outermost(caller, ctx.index)
    if outer is not caller and registered_closure(caller.path, caller.qualname, ctx.index) is not None:
        return (None,)  # a hook it registers runs in a (calibration) forward, not in the conversion
    entry = _entry(outer, ctx)
    if entry is not None:
        return (entry,)
    return outer


def _entry(func: Func, ctx: _Ctx) -> str | None:
    """An offline quantiser's entry (``[callers] quantiser``: ``quantize``
    of a class that also defines ``save_quantized``) no per-step function
    calls: weight preparation, a root like a converter."""
    owner = func.owner
    if owner is None or not ctx.quantisers or func.language is not Language.PYTHON:
        return None
    names = set(owner.methods)
    for base in owner.bases:
        for cls in ctx.index.classes_named(base.rsplit(".", 1)[-1]):
            names |= set(cls.methods)
    for entry, saver in ctx.quantisers:
        if entry(func.name) and any(saver(n) for n in names):
            if any(ctx.per_step(c.name) for c in _callers(func, ctx, False)):
                return None
            return f"{func.qualname}, {_OFFLINE}"
    return None


def _module(path: str, ctx: _Ctx) -> bool:
    found = ctx.modules.get(path)
    if found is None:
        found = ctx.modules[path] = conversion_module(path, ctx.words)
    return found


def decorator_registered(func: Func) -> bool:
    """A function a decorator registers (``@to_tensor.register(np.ndarray)``):
    what calls it is unknown."""
    scope = func.scope
    names = (d.split("(", 1)[0].rsplit(".", 1)[-1] for d in (scope.decorators if scope is not None else ()))
    return any(n not in _PLAIN_DECORATORS for n in names)


def _handed_on(func: Func, ctx: _Ctx) -> bool:
    """A function its file hands on as a value (``TABLE[key] = fn``,
    ``register(fn)``): what calls it is unknown."""
    if func.owner is not None or func.qualname == "<module>":
        return False
    found = ctx.handed.get(func.id)  # asked again for each depth the walk reaches the function at
    if found is None:
        found = ctx.handed[func.id] = _handed_on_in_file(func, ctx)
    return found


def _handed_on_in_file(func: Func, ctx: _Ctx) -> bool:
    name = func.name
    element: re.Pattern[str] | None = None
    for other in ctx.index.functions_in(func.path):
        for a in other.assigns:
            value = a.value
            if name not in value:
                continue  # both tests spell the name: most of the file's statements are never searched
            if value.strip() == name:
                return True
            if element is None:
                element = re.compile(rf"[\[{{(,:]\s*{re.escape(name)}\s*[,\]}})]")  # in a table literal
            if element.search(value):
                return True
    table = func.table  # the file's calls: `register(fn)`, `partial(fn, ...)`, `target=fn`
    return table is not None and any(
        name in text and any(arg.text.strip() == name for arg in split_args(text))
        for text in table.arglists)


def _built_on_path(func: Func, ctx: _Ctx, depth: int, seen: frozenset[str]) -> str | None:
    """For a method of a class the converter's own modules define: why every
    object of it is built on a conversion path (each resolved construction,
    through a constructor with callers, sits on one; the class has no
    subclass in the project), or None. Its calls by name through objects
    elsewhere (``config.prepare()``) then run another class's method of that
    name, not this one. A class defined elsewhere (a model a conversion
    script builds) may be built by other means too (a registry, ``cls(...)``)."""
    owner = func.owner
    if (owner is None or depth <= 0 or func.language is not Language.PYTHON or func.name.startswith("__")
            or not _module(func.path, ctx)):
        return None
    key = f"class:{owner.name}:{func.path}#{depth}"
    if key in ctx.memo:
        return ctx.memo[key]
    ctx.memo[key] = None  # a construction reached from its own methods adds no way in
    found: str | None = None
    ctors = ctx.index.constructors(owner)
    if ctors and not ctx.index.subclass_names(owner.name):
        dist = ctx.index.callers_within(ctors, 1)
        builders = [f for fid, d in dist.items() if d == 1 and (f := ctx.index.funcs.get(fid)) is not None
                    and not test_path(f.path)]
        roots = [_caller_on_path(b, ctx, depth - 1, seen) for b in builders]
        named = sorted({r for r in roots if r})
        if builders and named and all(r is not None for r in roots):
            found = f"{owner.name} is built only by {', '.join(named[:2])}"
    ctx.memo[key] = found
    return found


def _callers(func: Func, ctx: _Ctx, by_name: bool = True) -> list[Func]:
    """``callers_of``, once per function (the walk reaches one at several depths)."""
    key = (func.id, by_name)
    found = ctx.callers.get(key)
    if found is None:
        found = ctx.callers[key] = callers_of(func, ctx.index, by_name, ctx.named)
    return list(found)


def callers_of(func: Func, index: ProjectIndex, by_name: bool = True,
               named: dict[str, list[Func]] | None = None) -> list[Func]:
    """The resolved callers, and for a method the functions calling its name
    through another object where the call resolves nowhere (unless
    ``by_name`` is off: its objects are built only on the path). ``named``
    keeps ``called_by_name``'s answers (a pass asks for many methods of one name)."""
    dist = index.callers_within([func], 1)
    found = {fid: index.funcs[fid] for fid, d in dist.items() if d == 1 and fid in index.funcs}
    if by_name and func.owner is not None and not func.name.startswith("__"):
        by = named.get(func.name) if named is not None else None
        if by is None:
            by = called_by_name(func.name, index)
            if named is not None:
                named[func.name] = by
        for caller in by:
            if caller.id not in found and caller is not func:
                found[caller.id] = caller
    return list(found.values())


def called_by_name(name: str, index: ProjectIndex) -> list[Func]:
    """The functions calling ``name`` through an object where the call
    resolves nowhere, once per such call, in ``calls_named``'s order: what
    ``callers_of`` adds for every method of that name but the method itself
    and its resolved callers (a caller is added at its first such call,
    so skipping those keeps the order of the rest)."""
    out = []
    for caller, i in index.calls_named(name):
        if caller.table is None:
            continue
        callee = caller.table.callees[i]
        receiver = callee.rpartition(".")[0]
        if receiver in ("", "self", "cls") or not _object(caller, receiver, index):
            continue
        if index.imported(caller.path, name) == callee:
            continue  # a function imported by name, spelled whole (`from struct import pack`: `struct.pack`)
        if not index.resolve(caller, caller.table.callees[i]):
            out.append(caller)
    return out


def _object(caller: Func, receiver: str, index: ProjectIndex) -> bool:
    """The receiver is an object (``self.x``, a parameter, a local, a loop
    variable), not an imported module (``struct.pack``, ``np.pack``)."""
    root = re.split(r"[.\[(]", receiver, maxsplit=1)[0]
    return root.isidentifier() and (root == "self" or index.imported(caller.path, root) is None)
