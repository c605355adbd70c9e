"""Stage 4b, derive: default-device contexts followed through the call graph.

Input: the project index and each file's ``default_sites`` (tensor factories
called without a device). Output: the ones that run where a default-device
context may be in force, as device sites whose reason names the context.

PyTorch allocates a tensor without ``device=`` on the default device, which
is the host unless code enters ``with torch.device("cuda"):``, ``with
target_device:`` (``target_device = torch.device(...)``) or calls
``torch.set_default_device(...)`` (or, in older code,
``torch.set_default_tensor_type(torch.cuda.HalfTensor)``: a CUDA tensor type
is a CUDA default device; a host type or a type held in a variable is not
taken as one). Engines build whole models that way: the
loader enters the context, and every ``create_weights`` below it allocates
``torch.empty(...)`` with no device (DESIGN.md, "Default-device contexts").

A function is under a context when it is called from the context's body
through resolved calls (at most ``DEPTH`` of them). Model loaders build the
model through a class held in a variable (``model_class(**kwargs)``), which no
call graph resolves: when a context's reach makes such a dynamic construction,
the weight-creation scopes (``create_weight*``) and the constructors of
``nn.Module`` classes count as reached from it too, and so does what they
call. The device is ``cuda`` for a literal CUDA context and ``unknown``
otherwise (``torch.device(load_device)``); ``cpu`` and ``meta`` contexts
allocate no device memory. Assumption: a context entered anywhere is in force
for every caller path (a sound over-approximation, named in the reason).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..globs import test_path
from ..model import FileFacts, Language, Site, Span
from .built_classes import built_constructors
from .extract.python_sites import classify_device
from .index import Func, ProjectIndex, last_name

MODEL_BUILD = "model built by"  # the reason's words for a dynamic model construction
DEPTH = 6  # resolved calls followed from a context's body
FAN_OUT_DEPTH = 3  # resolved calls followed from a dynamically constructed module
WEIGHT_SCOPES = re.compile(r"^_?create_weights?\w*$")
_MODULE_BASES = frozenset({"Module", "nn.Module", "torch.nn.Module"})
# a context on another accelerator (`with torch.device(xm.xla_device()):`)
# puts nothing on the GPU
_OTHER_ACCELERATOR = re.compile(r"xla|tpu|xpu|mps|hpu|npu", re.IGNORECASE)
_SET_DEFAULT = frozenset({"torch.set_default_device", "set_default_device"})
_SET_TENSOR_TYPE = frozenset({"torch.set_default_tensor_type", "set_default_tensor_type"})
_SETS = _SET_DEFAULT | _SET_TENSOR_TYPE  # a file calls one when this is not disjoint from its callees
_CUDA_TENSOR_TYPE = re.compile(r"\bcuda\.\w*Tensor\b")


@dataclass(frozen=True)
class Context:
    """A region where tensors without a device land on ``device``."""

    path: str
    scope: str
    body: Span
    text: str  # "with target_device:", "torch.set_default_device(dev)"
    device: str  # cuda | unknown
    line: int  # where the context is entered

    def describe(self) -> str:
        return f"default-device context `{self.text}` in {self.scope} ({self.path}:{self.line})"


@dataclass(frozen=True)
class Placed:
    """Why a function runs under a context: the context and the call path."""

    context: Context
    via: str  # "" when lexically inside; else "through X -> Y" or the dynamic construction


def device_contexts(index: ProjectIndex, contexts: Iterable[str]) -> list[Context]:
    """Every default-device context of the Python files in the index."""
    wanted = frozenset(contexts)
    out: list[Context] = []
    for path, facts in index.files.items():
        if facts.language is not Language.PYTHON:
            continue
        # one test in C of the file's callees (``any`` over a generator was most of this function's time: it
        # runs over every Python file, five times a scan), and the calls' loop below only where it can find one
        sets = not _SETS.isdisjoint(facts.calls.callees)
        if not facts.withs and not sets:
            continue
        bindings = _device_bindings(facts, wanted)
        for w in facts.withs:
            for item in w.items:
                device, text = None, ""
                if item.callee in wanted and item.args:
                    device = classify_device(item.args[0].text)
                    text = f"with {item.callee}({item.args[0].text}):"
                elif not item.args and (w.scope, item.callee) in bindings:
                    device = bindings[(w.scope, item.callee)]
                    text = f"with {item.callee}:"
                elif not item.args and ("<module>", item.callee) in bindings:
                    device = bindings[("<module>", item.callee)]
                    text = f"with {item.callee}:"
                if device in ("cuda", "unknown") and not _OTHER_ACCELERATOR.search(text):
                    out.append(Context(path, w.scope, w.body, text, device, w.span.line))
        calls = facts.calls
        for i, callee in enumerate(calls.callees if sets else ()):
            if (callee not in _SET_DEFAULT and callee not in _SET_TENSOR_TYPE) or not calls.arglists[i].strip():
                continue
            arg = calls.arglists[i].split(",")[0].strip()
            if callee in _SET_TENSOR_TYPE:
                device = "cuda" if _CUDA_TENSOR_TYPE.search(arg) else "cpu"
                text = f"torch.set_default_tensor_type({arg})"
            else:
                device, text = classify_device(arg), f"torch.set_default_device({arg})"
            if device not in ("cuda", "unknown") or _OTHER_ACCELERATOR.search(arg):
                continue
            call = calls[i]
            func = index.func(path, call.scope)
            end = func.span if func is not None and func.span is not None else None
            body = Span(call.span.line, call.span.col, end.end_line if end else 10**9, end.end_col if end else 0)
            out.append(Context(path, call.scope, body, text, device, call.span.line))
    return out


def host_bodies(index: ProjectIndex, contexts: Iterable[str]) -> dict[str, list[Span]]:
    """Path -> the bodies of literal ``cpu``/``meta`` contexts: nothing in
    them lands on the GPU, also inside an outer device context."""
    wanted = frozenset(contexts)
    out: dict[str, list[Span]] = {}
    for path, facts in index.files.items():
        if facts.language is not Language.PYTHON:
            continue
        for w in facts.withs:
            if any(i.callee in wanted and i.args and classify_device(i.args[0].text) in ("cpu", "meta")
                   for i in w.items):
                out.setdefault(path, []).append(w.body)
    return out


def context_functions(index: ProjectIndex, contexts: Iterable[str]) -> list[Func]:
    """The functions that enter a default-device context (roots for the
    on-demand expansion: what they call must be analysed to be followed)."""
    out = []
    for ctx in device_contexts(index, contexts):
        func = index.func(ctx.path, ctx.scope)
        if func is not None:
            out.append(func)
    return out


def _device_bindings(facts: FileFacts, contexts: frozenset[str]) -> dict[tuple[str, str], str]:
    """(scope, name) -> device for `name = torch.device(...)` in a scope."""
    calls = facts.calls
    out: dict[tuple[str, str], str] = {}
    for i, callee in enumerate(calls.callees):
        target = calls.targets[i]
        if callee in contexts and target and calls.arglists[i].strip():
            out[(calls.scopes[i], target)] = classify_device(calls.arglists[i].split(",")[0])
    return out


def place_functions(index: ProjectIndex, found: list[Context],
                    host: Mapping[str, list[Span]] | None = None) -> dict[str, Placed]:
    """Function id -> the context it may run under (the first found)."""
    host = host or {}
    placed: dict[str, Placed] = {}
    dynamic: list[tuple[Context, str]] = []
    # production contexts first: a function reached from both keeps the
    # production one. A context in test code places only test code (a test
    # that sets the default device says nothing about production paths).
    for ctx in sorted(found, key=lambda c: test_path(c.path)):
        home = index.func(ctx.path, ctx.scope)
        if home is None:
            continue
        in_test = test_path(ctx.path)
        frontier: list[tuple[Func, str]] = []
        seen = {home.id}
        for call in home.calls:
            if not ctx.body.contains(call.span) or any(ctx.body.contains(b) and b.contains(call.span)
                                                    for b in host.get(ctx.path, ())):
                continue
            for target in index.resolve(home, call):
                if target.id not in seen and (not in_test or test_path(target.path)):
                    seen.add(target.id)
                    frontier.append((target, f"{home.qualname} -> {target.qualname}"))
            if not in_test and _dynamic_construction(home, call.callee):
                built = built_constructors(index, home, call.callee)
                if built is None:
                    dynamic.append((ctx, f"`{call.callee}(...)` in {home.qualname}"))
                for target in built or ():
                    if target.id not in seen:
                        seen.add(target.id)
                        frontier.append((target, f"{home.qualname} -> `{call.callee}` = {target.qualname}"))
        for _level in range(DEPTH):
            next_frontier: list[tuple[Func, str]] = []
            for func, path in frontier:
                placed.setdefault(func.id, Placed(ctx, f"through {path}"))
                for call in func.calls:
                    targets = index.resolve(func, call)
                    if not in_test and not targets and _dynamic_construction(func, call.callee):
                        built = built_constructors(index, func, call.callee)
                        if built is None:
                            dynamic.append((ctx, f"`{call.callee}(...)` in {func.qualname}"))
                        targets = built or ()
                    for target in targets:
                        if target.id not in seen and (not in_test or test_path(target.path)):
                            seen.add(target.id)
                            next_frontier.append((target, f"{path} -> {target.qualname}"))
            frontier = next_frontier
            if not frontier:
                break
    if dynamic:
        ctx, how = dynamic[0]
        _fan_out(index, placed, Placed(ctx, f"{MODEL_BUILD} {how}"))
    return placed


def _dynamic_construction(func: Func, callee: str) -> bool:
    """A call of a class held in a variable: a parameter or a local the
    function assigns (`model_class, _ = get_model_architecture(...)`)."""
    if not callee.isidentifier() or func.language is not Language.PYTHON:
        return False
    scope = func.scope
    if scope is not None and callee in scope.params:
        return True
    return any(c.target == callee for c in func.calls) or \
        any(callee in (t.strip() for t in ",".join(a.targets).split(",")) for a in func.assigns)


def _fan_out(index: ProjectIndex, placed: dict[str, Placed], why: Placed) -> None:
    """Weight-creation scopes and module constructors, and what they call."""
    roots: list[Func] = []
    module_memo: dict[str, bool] = {}
    for func in index.functions():
        if func.language is not Language.PYTHON or func.scope is None or test_path(func.path):
            continue
        owner = func.owner
        module_constructor = func.scope.role == "constructor" and owner is not None and \
            is_module(index, owner.qualname, owner.bases, module_memo)
        if WEIGHT_SCOPES.match(func.name) or module_constructor:
            roots.append(func)
    seen: set[str] = set()
    frontier = roots
    for _level in range(FAN_OUT_DEPTH + 1):
        next_frontier: list[Func] = []
        for func in frontier:
            if func.id in seen:
                continue
            seen.add(func.id)
            placed.setdefault(func.id, why)
            for _call, targets in index.callees(func):
                next_frontier.extend(t for t in targets if t.id not in seen)
        frontier = next_frontier


def is_module(index: ProjectIndex, name: str, bases: Iterable[str], memo: dict[str, bool], depth: int = 0) -> bool:
    """True when a class derives (by base names) from ``nn.Module``."""
    found = memo.get(name)
    if found is not None:
        return found
    memo[name] = False  # cycle guard
    result = False
    for base in bases:
        if base in _MODULE_BASES or base.endswith(".Module"):
            result = True
            break
        if depth < 12:
            for cls in index.classes_named(last_name(base)):
                if is_module(index, cls.qualname, cls.bases, memo, depth + 1):
                    result = True
                    break
        if result:
            break
    memo[name] = result
    return result


def promote_default_sites(index: ProjectIndex, files: Mapping[str, FileFacts],
                          contexts: Iterable[str], engines: Iterable[str] = ()) -> list[Site]:
    """The factories without a device that run under a default-device
    context, as device sites; ``device_context`` names the context."""
    if not any(f.default_sites for f in files.values()):
        return []
    found = device_contexts(index, contexts)
    hooks = engine_hooks(index, files, frozenset(engines))
    if not found and not hooks:
        return []
    host = host_bodies(index, contexts)
    placed = {**hooks, **place_functions(index, found, host)}
    out: list[Site] = []
    for path, facts in files.items():
        if not facts.default_sites:
            continue
        lexical = [c for c in found if c.path == path]
        for site in facts.default_sites:
            where: Placed | None = None
            for ctx in lexical:
                if ctx.body.contains(site.span) and (site.scope == ctx.scope or site.scope.startswith(ctx.scope + ".")
                                                     or ctx.scope == "<module>"):
                    where = Placed(ctx, "")
            if where is not None and any(b.contains(site.span) and where.context.body.contains(b)
                                         for b in host.get(path, ())):
                continue  # an inner cpu/meta context wins over the outer one
            if where is None:
                func = index.func(path, site.scope)
                where = placed.get(func.id) if func is not None else None
                if where is not None and func is not None and func.span is not None \
                        and any(func.span.contains(b) and b.contains(site.span) for b in host.get(path, ())):
                    continue  # in the function's own `with torch.device("cpu"):`: the caller's context yields
            if where is None:
                continue
            how = f"; {where.via}" if where.via else ""
            out.append(dataclasses.replace(site, device=where.context.device,
                                           device_context=f"under {where.context.describe()}{how}"))
    return out


def engine_hooks(index: ProjectIndex, files: Mapping[str, FileFacts], engines: frozenset[str]) -> dict[str, Placed]:
    """A quantisation method plugged into a serving engine: a
    ``create_weights`` method no project code calls, in a file importing the
    engine (``[default-device] engines``), runs where the engine's model
    loader calls it, under its default-device context."""
    out: dict[str, Placed] = {}
    if not engines:
        return out
    for path, facts in files.items():
        if facts.language is not Language.PYTHON or not facts.default_sites or test_path(path):
            continue
        engine = next((i.target.split(".", 1)[0] for i in facts.imports
                       if i.target.split(".", 1)[0] in engines), None)
        if engine is None:
            continue
        for func in index.functions_in(path):
            if func.name != "create_weights" or func.owner is None or func.span is None:
                continue
            if index.callers_within([func], 1).keys() - {func.id}:
                continue
            ctx = Context(path, f"{engine}'s model loader, which calls {func.qualname}", func.span,
                          "with target_device:", "unknown", func.span.line)
            out[func.id] = Placed(ctx, "")
    return out
