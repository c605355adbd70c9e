"""Stage 5, last: a lazily built member that a per-step method drops again
is made anew each step (issue 11, round 20).

``lazy_members`` keeps ``if self.x is None: self.x = torch.zeros(...)`` for
the process (T2): it is rebuilt only when ``self.x`` is None. What sets it
back to None decides: another method of the class that sets ``self.x =
None`` and runs once per step (a per-step name, or ``train_batch``/``eval_batch``, or
one a per-step function calls: ``release_workspace()`` from ``generate``;
a loop's calls do not count: ``unload()`` in a loader's loop, a test's loop) drops it every step, so
the next step builds it again: T4. The reset may sit under a test of a
configuration flag of the object (``if self.contiguous_gradients:``, a bare
``self.flag``, decided once); under any other test (``if stale:``) or in a
method not run per step (``reset()``), the member stays T2. Pure; only
Python T2 sites ``lazy_members`` decided are looked at.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Language, Site, Tier
from .index import Func, ProjectIndex
from .lazy_members import member_of
from .repinned_members import step_reason
from .retier import Decision, retier

_LAZY = "created lazily: "
# one batch per call: a training engine's `train_batch(data_iter)`, `eval_batch`
_BATCH = re.compile(r"_*(?:train|eval)_batch")
_FLAG = re.compile(r"(?:not\s+)?self\.[A-Za-z_]\w*")


def reset_per_step(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.per_step:
        return list(sites)
    named = matcher(globs.per_step)

    def per_step(name: str) -> bool:
        return named(name) or _BATCH.fullmatch(name) is not None
    memo: dict[str, str] = {}

    def eligible(site: Site) -> bool:
        return site.tier is Tier.T2 and site.via is None and site.language is Language.PYTHON \
            and site.tier_reason.startswith(_LAZY)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.owner is None:
            return None
        member = member_of(site, func)
        line = site.stmt_line or site.span.line
        # rebuilt when the member is missing (`if self.x is None:`), not moved while present (`is not None`)
        if member is None or not any(b.test and _missing(b.test, member) for b in func.blocks
                                     if b.span.contains_line(line)):
            return None
        prefix = func.owner.qualname + "."
        for method in index.functions_in(site.path):
            if method is func or not method.qualname.startswith(prefix) or method.scope is None \
                    or method.scope.role == "constructor" or not _resets(method, member):
                continue
            if method.id not in memo:
                memo[method.id] = step_reason(method, index, per_step, depth=1, loops=False)
            if memo[method.id]:
                return Tier.T4, (f"rebuilt per step: {method.qualname} sets {member} back to None on every step "
                                 f"({memo[method.id]}); was: {site.tier_reason}")
        return None

    return retier(sites, eligible, decide)


def _resets(method: Func, member: str) -> bool:
    """``method`` sets ``member`` to None, at its top level or under a test
    of a flag of the object only, outside loops."""
    for a in method.assigns:
        if a.op != "=" or a.targets != (member,) or a.value.strip() != "None":
            continue
        around = [b for b in method.blocks if b.span.contains_line(a.line)]
        if all(b.kind == "if" and _FLAG.fullmatch(b.test.strip()) and b.test.strip().removeprefix("not ").strip()
               != member for b in around):
            return True
    return False


def _missing(test: str, member: str) -> bool:
    return f"{member} is None" in test or f"not {member}" in test.replace("not hasattr", "")
