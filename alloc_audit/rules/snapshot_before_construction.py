"""
## What it flags
A memory measurement that is taken and kept (`self.init_snapshot =
MemorySnapshot(...)`, `free, total = torch.cuda.mem_get_info()`,
`base = torch.cuda.memory_allocated()`, `cudaMemGetInfo(&free, &total)`; the
list is `measurements`), followed later in
the same function by the construction of an object whose constructor
allocates device memory, directly or through helper methods and factories
(`self._make_buffer(...)` -> `torch.zeros`). Constructions in either branch
of an `if`/`else` count. Model weights (T1) do not: they are measured when
they are loaded.

## Why it matters
The measurement is the baseline later budgets are computed from; it cannot
see buffers that do not exist yet. Whatever the constructor allocates lands
in no budget term, so the KV cache is over-budgeted by exactly that amount
(in one real engine, ~36 MiB of `inputs_embeds` and friends).

## Example
```python
def init_device(self):
    self.init_snapshot = MemorySnapshot(self.device)
    self.model_runner = GPUModelRunner(self.config, self.device)   # allocates its input buffers
```

## How to fix
Take the measurement after the construction, or account for the
constructor's buffers explicitly (and say so in a suppression).

## How to suppress
On the measurement's line or the line above:
`# alloc-audit: ignore[snapshot-before-construction] runner buffers added to the budget in plan_memory()`.

A measurement counts when it is kept: stored on an object, or read again
after the construction. A local reading used only before it (a test's skip
check) is not a baseline and is not reported. A counter reset
(`torch.cuda.reset_peak_memory_stats()`) stores no value, and a later peak
reading does include the constructor's buffers, so a reset is not reported.

## Known false positives
A measurement kept only for logging, or retaken under another name after
the construction, is still reported (a retake into the same variable is
recognised).

## Known false negatives
Measurement and construction in different functions (`init_device` and
`load_model`) are not connected; constructions through receivers of unknown
type are not followed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..globs import matcher
from ..model import Call, Finding, Related, Severity
from ..pack import RulePack
from ..pipeline.index import Func, Reach, last_name
from ._lib.construction import constructed_allocation
from ._lib.findings import finding_at, path_text
from .base import Rule, RuleContext, StartPoints, Triggers

NAME = "snapshot-before-construction"
_RESETS = ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats")


def _measured_names(call: Call) -> list[str]:
    if call.target:
        return [t.strip() for t in call.target.strip("()[] ").split(",") if t.strip() not in ("", "_")]
    if "&" in call.arglist:  # cudaMemGetInfo(&free, &total)
        return [a.strip().lstrip("&") for a in call.arglist.split(",") if a.strip().startswith("&")]
    return []


def _kept_after(func: Func, snap: Call, line: int) -> bool:
    """A measurement is a baseline when it outlives the construction: stored
    on an object, or read after ``line``. A local reading used only before
    (a skip check) is not."""
    names = _measured_names(snap)
    if any(n.startswith(("self.", "cls.", "this->")) for n in names):
        return True
    words = [re.compile(rf"(?<![\w.]){re.escape(n)}(?!\w)") for n in names]
    if not words:
        return False
    texts = [c.arglist for c in func.calls if c.span.line > line]
    texts += [a.value for a in func.assigns if a.line > line]
    texts += [r.value for r in func.returns if r.line > line]
    texts += [b.test for b in func.blocks if b.span.line > line]
    return any(w.search(t) for w in words for t in texts)


def check(ctx: RuleContext) -> Iterator[Finding]:
    is_measurement = matcher(ctx.pack.measurements)
    index = ctx.index
    depth = max(ctx.pack.capture_depth, 3)
    measuring = index.callers_matching(is_measurement)
    for func in index.funcs.values():
        if func.scope is None or func.id not in measuring:
            continue
        calls = sorted(func.calls, key=lambda c: (c.span.line, c.span.col))
        for i, snap in enumerate(calls):
            if not is_measurement(snap.callee) or last_name(snap.callee) in _RESETS:
                continue  # a reset keeps no value; a later peak reading sees the constructions
            if snap.target and any(is_measurement(c.callee) and c.target == snap.target for c in calls[i + 1:]):
                continue  # measured again into the same place: that later baseline sees the constructions
            hidden: list[tuple[Call, Reach]] = []
            for later in calls[i + 1:]:
                if later.span.line == snap.span.line or is_measurement(later.callee):
                    continue
                reach = constructed_allocation(index, func, later, depth, objects_only=True)
                if reach is not None:
                    hidden.append((later, reach))
            if not hidden or not _kept_after(func, snap, hidden[0][0].span.line):
                continue
            names = ", ".join(dict.fromkeys(c.callee for c, _ in hidden))
            related: list[Related] = []
            for construction, reach in hidden:
                related.append(Related(func.path, construction.span.line,
                                       f"constructs {construction.callee} afterwards"))
                site = reach.site
                related.append(Related(site.path, site.span.line,
                                       f"{path_text(reach.hops, site.api)} allocates {site.kind.value} memory "
                                       f"the measurement cannot see"))
            kept_as = f" (kept in {snap.target})" if snap.target else ""
            yield finding_at(
                NAME, Severity.ERROR, func.path, snap.span.line, snap.span.col, func.qualname, snap.callee,
                f"{snap.callee}{kept_as} is measured before {names} is constructed at line "
                f"{hidden[0][0].span.line}, whose constructor allocates device memory this baseline cannot see; "
                "measure after the construction or count those buffers in the budget",
                tuple(related),
            )



def starts(pack: RulePack) -> StartPoints:
    """Where this rule starts looking (the expansion parses what these call)."""
    return StartPoints(calls=pack.measurements)


def triggers(pack: RulePack) -> Triggers:
    """What a file must say for this rule to need it parsed."""
    return Triggers(called=pack.measurements)

RULE = Rule(
    name=NAME,
    severity=Severity.ERROR,
    summary="a memory measurement taken before constructing an object whose constructor allocates",
    doc=__doc__ or "",
    check=check,
    starts=starts,
    triggers=triggers,
)
