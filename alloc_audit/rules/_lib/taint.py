"""Data flow of live free-memory readings, for live-free-memory-sizing.

A reading (``torch.cuda.mem_get_info()``, ``cudaMemGetInfo(&free, ...)``, a
``.free_memory`` attribute) taints the names it is stored into; taint flows
through assignments and arithmetic, into the parameters of project
functions it is passed to, and back out of functions that return it, up to
``flow-depth`` calls away. A sink is an allocation whose size mentions a
tainted name. Calls into functions outside the project pass taint through to
their result (``int(free * 0.9)``, ``min(free, cap)``).

Each tainted name remembers how it got tainted (the reading, then each hop),
which becomes the finding's related locations, and whether its *shape* is
tainted too (``shapes.py``): a tensor filled with values derived from a
reading has a shape that is not, so ``x.shape[0]``, ``len(x)`` and
``x.numel()`` of it carry no taint. Native code keeps every name shaped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ...arglists import split_args
from ...model import Arg, Assign, Call, Language, Related, Site, SiteKind, Span
from ...pipeline.index import Func, ProjectIndex, last_name
from ...pipeline.index.values import Env
from .findings import DEVICE_KINDS
from .paths import PathReach, check_span, env_key
from .shapes import shape_tainted, without_free_shapes

_CHAIN = re.compile(r"[A-Za-z_]\w*(?:(?:\.|->)[A-Za-z_]\w*)*")
# readings that return (free, total): only the first is free memory
_PAIRS = ("mem_get_info", "cudaMemGetInfo", "cuMemGetInfo", "cuMemGetInfo_v2")
_STRING = re.compile(r"""(?:(?<!\w)([fF]))?(?:"[^"\n]*"|'[^'\n]*')""")
_FIELD = re.compile(r"\{([^{}]*)\}")


def chains(text: str) -> list[str]:
    out = []
    for m in _CHAIN.finditer(text):
        chain = m.group(0).replace("->", ".")
        out.append(chain[5:] if chain.startswith("this.") else chain)
    return out


@dataclass
class Flow:
    """Taint state of one function analysed under given tainted parameters."""

    tainted: dict[str, tuple[Related, ...]] = field(default_factory=dict)
    shaped: set[str] = field(default_factory=set)  # tainted names whose shape (len, numel) is tainted too
    returns: tuple[Related, ...] | None = None
    returns_shaped: bool = True
    sinks: list[tuple[Site, tuple[Related, ...]]] = field(default_factory=list)


class TaintAnalysis:
    def __init__(self, index: ProjectIndex, is_reading: Callable[[str], bool], attributes: tuple[str, ...],
                 depth: int) -> None:
        self.index = index
        self.is_reading = is_reading
        self.attributes = attributes
        self.depth = depth
        self._memo: dict[tuple[str, frozenset[str], frozenset[str], int, tuple[tuple[str, str, str], ...]], Flow] = {}
        self.paths = PathReach(index)

    @staticmethod
    def _key(flow: Flow, chain: str) -> str | None:
        """The tainted name a chain reads (itself or a prefix), or None."""
        if chain in flow.tainted:
            return chain
        head = chain.split(".")
        for i in range(len(head) - 1, 0, -1):
            if ".".join(head[:i]) in flow.tainted:
                return ".".join(head[:i])
        return None

    def _shape_free(self, flow: Flow, chain: str) -> bool:
        key = self._key(flow, chain)
        return key is not None and key not in flow.shaped

    def _shaped(self, flow: Flow, func: Func, text: str) -> bool:
        """Whether the value of ``text`` has a tainted shape (always, in native code)."""
        if func.language is not Language.PYTHON:
            return True
        return shape_tainted(text, lambda t: self.expression_taint(flow, t) is not None,
                             lambda c: (k := self._key(flow, c)) is not None and k in flow.shaped)

    def _taint(self, flow: Flow, name: str, why: tuple[Related, ...], shaped: bool) -> None:
        flow.tainted.setdefault(name, why)
        if shaped:
            flow.shaped.add(name)

    def expression_taint(self, flow: Flow, text: str) -> tuple[Related, ...] | None:
        # a string's words are not names (`graphs[bs]["input_lengths"]`), an f-string's fields are
        text = _STRING.sub(lambda m: " ".join(_FIELD.findall(m.group(0))) if m.group(1) else '""', text)
        text = without_free_shapes(text, lambda name: self._shape_free(flow, name))
        for chain in chains(text):
            found = flow.tainted.get(chain)
            if found is not None:
                return found
            head = chain.split(".")
            for i in range(len(head) - 1, 0, -1):
                found = flow.tainted.get(".".join(head[:i]))
                if found is not None:
                    return found
            if head[-1] in self.attributes:
                return ()
        return None

    def analyse(self, func: Func, params: frozenset[str] = frozenset(), depth: int | None = None,
                origin: tuple[Related, ...] | Mapping[str, tuple[Related, ...]] = (),
                shaped: frozenset[str] | None = None,
                env: Env | None = None) -> Flow:
        """``shaped``: the params whose shape is tainted too (default: all);
        ``env``: what the call edge passes (``ProjectIndex.edge_values``):
        calls and allocations on branches those values rule out are
        skipped, as in alloc-in-capture's path-sensitive reach; unknown
        values keep every branch."""
        depth = self.depth if depth is None else depth
        shaped = params if shaped is None else shaped
        env = env or {}
        key = (func.id, params, shaped, depth, env_key(env))
        memo = self._memo.get(key)
        if memo is not None:
            return memo
        flow = Flow()
        self._memo[key] = flow  # recursion guard: a cycle sees an empty flow
        for name in params:  # each parameter's witness is the taint of its own argument
            flow.tainted[name] = origin.get(name, ()) if isinstance(origin, Mapping) else origin
        flow.shaped |= shaped
        constants = self.paths.constants(func)
        structure = self.paths.structure(func)

        def live(span: Span) -> bool:
            return check_span(func, span, env, constants, structure).live

        events: list[tuple[int, int, Call | Assign]] = [(c.span.line, 0, c) for c in func.calls if live(c.span)]
        events += [(a.line, 1, a) for a in func.assigns]
        events.sort(key=lambda e: (e[0], e[1]))
        for _round in range(2):  # a second pass lets loops carry taint backwards
            for _line, _order, item in events:
                if isinstance(item, Assign):
                    self._assign(flow, func, item)
                else:
                    self._call(flow, func, item, depth, env)
        for site in func.sites:
            if site.kind not in DEVICE_KINDS or site.via is not None or not live(site.span):
                continue
            size = " ".join(filter(None, (site.size, *site.shape)))
            taint = self.expression_taint(flow, size) if size else None
            if taint is not None and (site, taint) not in flow.sinks:
                flow.sinks.append((site, taint))
        for ret in func.returns:
            taint = self.expression_taint(flow, ret.value) if ret.value else None
            if taint is not None:
                flow.returns = (*taint, Related(func.path, ret.line, f"{func.qualname} returns {ret.value}"))
                flow.returns_shaped = self._shaped(flow, func, ret.value)
                break
        return flow

    def _assign(self, flow: Flow, func: Func, assign: Assign) -> None:
        taint = self.expression_taint(flow, assign.value)
        if taint is None:
            return
        shaped = self._shaped(flow, func, assign.value)
        for target in assign.targets:
            self._taint(flow, target.lstrip("*&"), (*taint, Related(
                func.path, assign.line, f"{target} = {assign.value}")), shaped)

    def _call(self, flow: Flow, func: Func, call: Call, depth: int, env: Env) -> None:
        line = call.span.line
        if self.is_reading(call.callee):
            here = Related(func.path, line, f"live free-memory reading {call.callee}")
            for name in self._reading_outputs(func, call):
                self._taint(flow, name, (here,), False)  # a number of bytes
            return
        args = split_args(call.arglist, func.language is not Language.PYTHON)
        tainted_args = [(i, t) for i, a in enumerate(args) if (t := self.expression_taint(flow, a.text)) is not None]
        targets = self.index.resolve(func, call)
        result: tuple[Related, ...] | None = None
        result_shaped = True
        if depth > 0:
            for target in targets:
                if target is func or target.scope is None:
                    continue
                bound = self._bind(target, list(args), [i for i, _t in tainted_args])
                names = [n for n, _i in bound]
                taint_of = dict(tainted_args)
                passed = Related(func.path, line, f"passed to {call.callee}")
                origin = {n: (*taint_of[i], passed) for n, i in bound}
                shaped = frozenset(n for n, i in bound if self._shaped(flow, func, args[i].text))
                values = self.index.edge_values(func, call, target, env)
                inner = self.analyse(target, frozenset(names), depth - 1, origin, shaped, values)
                for sink in inner.sinks:
                    if sink not in flow.sinks:
                        flow.sinks.append(sink)
                if inner.returns is not None and result is None:
                    result = (*inner.returns, Related(func.path, line, f"{call.callee} returns it"))
                    result_shaped = inner.returns_shaped
        if result is None and tainted_args and not targets:
            result = (*tainted_args[0][1], Related(func.path, line, f"{call.callee}(...)"))
            result_shaped = self._shaped(flow, func, f"{call.callee}({call.arglist})")
        if result is not None and call.target:
            for name in call.target.split(","):
                self._taint(flow, name.strip().lstrip("*&"), result, result_shaped)

    def _reading_outputs(self, func: Func, call: Call) -> list[str]:
        leaf = last_name(call.callee)
        pair = leaf in _PAIRS
        if call.target:
            names = [t.strip() for t in call.target.strip("()[] ").split(",")]
            return names[:1] if pair else names
        if func.language is not Language.PYTHON:  # out-parameters: cudaMemGetInfo(&free, &total)
            outs = [a.text.lstrip("&").strip() for a in split_args(call.arglist, True) if a.text.startswith("&")]
            return outs[:1] if pair else outs
        return []

    def _bind(self, target: Func, args: list[Arg], tainted: list[int]) -> list[tuple[str, int]]:
        """Parameter names of ``target`` that receive the tainted arguments,
        each with the index of its argument."""
        scope = target.scope
        if scope is None or not tainted:
            return []
        params = [p for p in scope.params if not p.startswith("*")]
        if target.language is Language.PYTHON and target.owner is not None and params and params[0] in ("self", "cls"):
            params = params[1:]
        out = []
        positional = [i for i, a in enumerate(args) if a.keyword is None]
        for i in tainted:
            arg = args[i]
            if arg.keyword is not None:
                if arg.keyword in params:
                    out.append((arg.keyword, i))
            else:
                k = positional.index(i)
                if k < len(params):
                    out.append((params[k], i))
        return out


def reading_roots(index: ProjectIndex, is_reading: Callable[[str], bool], attributes: tuple[str, ...]) -> list[Func]:
    attr = re.compile(r"\.(?:" + "|".join(re.escape(a) for a in attributes) + r")\b") if attributes else None
    roots = []
    reading = index.callers_matching(is_reading)
    for func in index.funcs.values():
        if func.scope is None:
            continue
        if func.id in reading:
            roots.append(func)
        elif attr is not None and (any(attr.search(a.value) for a in func.assigns)
                                   or any(attr.search(a) for a in func.arglists)):
            roots.append(func)
    return roots


def is_device(site: Site) -> bool:
    return site.kind in DEVICE_KINDS and site.kind is not SiteKind.RELEASE
