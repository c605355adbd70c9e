"""Where CUDA-graph capture is active, lexically: the bodies of capture
``with`` statements, the stretch between a begin-capture and an end-capture
call in one function, and whole functions the configuration declares
captured. Shared by alloc-in-capture and the pool rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ...globs import matcher
from ...model import Call, Language, Span, With
from ...pipeline.index import Func, ProjectIndex


@dataclass(frozen=True)
class CaptureRegion:
    func: Func
    start: Span  # where capture starts (the with statement, the begin call, the function)
    body: Span  # the lines under capture
    name: str  # what starts it: "torch.cuda.graph", "cudaStreamBeginCapture", "captured by configuration"

    def contains(self, span: Span) -> bool:
        return (self.body.line, self.body.col) <= (span.line, span.col) and (span.end_line, span.end_col) <= (
            self.body.end_line,
            self.body.end_col,
        )


def with_items(func: Func, is_context: Callable[[str], bool]) -> Iterator[tuple[With, str]]:
    for w in func.withs:
        for item in w.items:
            if is_context(item.callee):
                yield w, item.callee


def capture_regions(index: ProjectIndex, contexts: tuple[str, ...], begin: tuple[str, ...], end: tuple[str, ...],
                    captured: tuple[str, ...]) -> list[CaptureRegion]:
    is_context = matcher(contexts)
    is_begin = matcher(begin)
    is_end = matcher(end)
    is_captured = matcher(captured)
    regions: list[CaptureRegion] = []
    beginning = index.callers_matching(is_begin)
    memo: dict[str, bool] = {}
    for func in index.funcs.values():
        for w in func.withs:
            for item in w.items:
                named = is_context(item.callee)
                # a project context manager is read, not guessed from its name
                begins = _project_context_begins(index, func, item.callee, is_context, is_begin, memo)
                if begins is True or (named and begins is None):
                    regions.append(CaptureRegion(func, w.span, w.body, item.callee))
        if func.id in beginning:
            calls = sorted(func.calls, key=lambda c: (c.span.line, c.span.col))
            for i, call in enumerate(calls):
                if not is_begin(call.callee):
                    continue
                stop = next((c for c in calls[i + 1:] if is_end(c.callee)), None)
                if stop is not None:
                    last = (stop.span.line, stop.span.col)
                else:  # no end call here: capture lasts to the end of the function
                    whole = func.span or call.span
                    last = (whole.end_line, whole.end_col)
                body = Span(call.span.end_line, call.span.end_col, *last)
                regions.append(CaptureRegion(func, call.span, body, call.callee))
        scope = func.scope
        if captured and scope is not None and scope.kind == "function" and (
            is_captured(func.qualname.replace("::", ".")) or is_captured(dotted_id(func))
        ):
            regions.append(CaptureRegion(func, scope.span, scope.span, "captured by configuration"))
    regions.sort(key=lambda r: (r.func.path, r.start.line, r.start.col))
    return regions


def _project_context_begins(index: ProjectIndex, func: Func, callee: str, is_context: Callable[[str], bool],
                            is_begin: Callable[[str], bool], memo: dict[str, bool]) -> bool | None:
    """Whether the project context manager a ``with`` item calls begins a
    capture (a `@contextmanager` generator whose body enters a capture
    context or calls a begin-capture); None when the item is not a project
    context manager (a library's, or one that cannot be resolved)."""
    if func.language is not Language.PYTHON or callee.startswith("torch."):
        return None
    targets = [t for t in index.resolve(func, callee) if t.scope is not None and t.scope.yields]
    if not targets:
        return None
    return any(_begins_capture(index, t, is_context, is_begin, memo, 2) for t in targets)


def _begins_capture(index: ProjectIndex, func: Func, is_context: Callable[[str], bool],
                    is_begin: Callable[[str], bool], memo: dict[str, bool], depth: int) -> bool:
    found = memo.get(func.id)
    if found is not None:
        return found
    memo[func.id] = False  # cycle guard
    found = any(is_begin(c) for c in func.callees)
    if not found:
        for w in func.withs:
            for item in w.items:
                inner = _project_context_begins(index, func, item.callee, is_context, is_begin, memo) \
                    if depth > 0 else None
                if inner is True or (inner is None and is_context(item.callee)):
                    found = True
    memo[func.id] = found
    return found


def dotted_id(func: Func) -> str:
    """``pkg/ops/attn.py`` + ``fn`` -> ``pkg.ops.attn.fn`` (module-qualified)."""
    module = func.module or func.path.rsplit(".", 1)[0].replace("/", ".")
    return f"{module}.{func.qualname.replace('::', '.')}"


def calls_in(func: Func, region: CaptureRegion) -> list[Call]:
    return [c for c in func.calls if region.contains(c.span)]
