"""Data flow of live free-memory readings, for live-free-memory-sizing.

A reading (``torch.cuda.mem_get_info()``, ``cudaMemGetInfo(&free, ...)``, a
``.free_memory`` attribute) taints the names it is stored into; taint flows
through assignments and arithmetic, into the parameters of project
functions it is passed to, and back out of functions that return it, up to
``flow-depth`` calls away. A sink is an allocation whose size mentions a
tainted name. Calls into functions outside the project pass taint through to
their result (``int(free * 0.9)``, ``min(free, cap)``).

Each tainted name remembers how it got tainted (the reading, then each hop),
which becomes the finding's related locations.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ...arglists import split_args
from ...model import Arg, Assign, Call, Language, Related, Site, SiteKind
from ...pipeline.index import Func, ProjectIndex, last_name
from .findings import DEVICE_KINDS

_CHAIN = re.compile(r"[A-Za-z_]\w*(?:(?:\.|->)[A-Za-z_]\w*)*")
# readings that return (free, total): only the first is free memory
_PAIRS = ("mem_get_info", "cudaMemGetInfo", "cuMemGetInfo", "cuMemGetInfo_v2")


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
    returns: tuple[Related, ...] | None = None
    sinks: list[tuple[Site, tuple[Related, ...]]] = field(default_factory=list)


class TaintAnalysis:
    def __init__(self, index: ProjectIndex, is_reading: Callable[[str], bool], attributes: tuple[str, ...],
                 depth: int) -> None:
        self.index = index
        self.is_reading = is_reading
        self.attributes = attributes
        self.depth = depth
        self._memo: dict[tuple[str, frozenset[str], int], Flow] = {}

    def expression_taint(self, flow: Flow, text: str) -> tuple[Related, ...] | None:
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
                origin: tuple[Related, ...] = ()) -> Flow:
        depth = self.depth if depth is None else depth
        key = (func.id, params, depth)
        memo = self._memo.get(key)
        if memo is not None:
            return memo
        flow = Flow()
        self._memo[key] = flow  # recursion guard: a cycle sees an empty flow
        for name in params:
            flow.tainted[name] = origin
        events: list[tuple[int, int, Call | Assign]] = [(c.span.line, 0, c) for c in func.calls]
        events += [(a.line, 1, a) for a in func.assigns]
        events.sort(key=lambda e: (e[0], e[1]))
        for _round in range(2):  # a second pass lets loops carry taint backwards
            for _line, _order, item in events:
                if isinstance(item, Assign):
                    self._assign(flow, func, item)
                else:
                    self._call(flow, func, item, depth)
        for site in func.sites:
            if site.kind not in DEVICE_KINDS or site.via is not None:
                continue
            size = " ".join(filter(None, (site.size, *site.shape)))
            taint = self.expression_taint(flow, size) if size else None
            if taint is not None and (site, taint) not in flow.sinks:
                flow.sinks.append((site, taint))
        for ret in func.returns:
            taint = self.expression_taint(flow, ret.value) if ret.value else None
            if taint is not None:
                flow.returns = (*taint, Related(func.path, ret.line, f"{func.qualname} returns {ret.value}"))
                break
        return flow

    def _assign(self, flow: Flow, func: Func, assign: Assign) -> None:
        taint = self.expression_taint(flow, assign.value)
        if taint is None:
            return
        for target in assign.targets:
            flow.tainted.setdefault(target.lstrip("*&"), (*taint, Related(
                func.path, assign.line, f"{target} = {assign.value}")))

    def _call(self, flow: Flow, func: Func, call: Call, depth: int) -> None:
        line = call.span.line
        if self.is_reading(call.callee):
            here = Related(func.path, line, f"live free-memory reading {call.callee}")
            for name in self._reading_outputs(func, call):
                flow.tainted.setdefault(name, (here,))
            return
        args = split_args(call.arglist, func.language is not Language.PYTHON)
        tainted_args = [(i, t) for i, a in enumerate(args) if (t := self.expression_taint(flow, a.text)) is not None]
        targets = self.index.resolve(func, call)
        result: tuple[Related, ...] | None = None
        if depth > 0:
            for target in targets:
                if target is func or target.scope is None:
                    continue
                names = self._bind(target, list(args), [i for i, _t in tainted_args])
                if names:
                    origin = (*tainted_args[0][1], Related(func.path, line, f"passed to {call.callee}"))
                else:
                    origin = ()
                inner = self.analyse(target, frozenset(names), depth - 1, origin)
                for sink in inner.sinks:
                    if sink not in flow.sinks:
                        flow.sinks.append(sink)
                if inner.returns is not None and result is None:
                    result = (*inner.returns, Related(func.path, line, f"{call.callee} returns it"))
        if result is None and tainted_args and not targets:
            result = (*tainted_args[0][1], Related(func.path, line, f"{call.callee}(...)"))
        if result is not None and call.target:
            for name in call.target.split(","):
                flow.tainted.setdefault(name.strip().lstrip("*&"), result)

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

    def _bind(self, target: Func, args: list[Arg], tainted: list[int]) -> list[str]:
        """Parameter names of ``target`` that receive the tainted arguments."""
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
                    out.append(arg.keyword)
            else:
                k = positional.index(i)
                if k < len(params):
                    out.append(params[k])
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
