"""Stage 5, after the lazily built members: a helper that rebuilds a buffer
it is handed only when that one is missing or too small, and returns it,
where every caller hands in an object's member and stores the result back
into the same member, keeps the buffer on the object: T2, grown on demand
(issue 11, round 22).

    def ensure_buffer(storage, n, device):
        if storage is None or storage.shape[0] < n:
            storage = torch.empty(n, device=device)     # T2: kept in self._buf
        return storage

    self._buf = ensure_buffer(self._buf, n, device)    # every caller

``lazy_members`` reads a test on ``self.x`` in the method that stores it;
here the test is on a parameter and the store is in the callers. The site
binds the parameter ``P`` itself, under an ``if`` whose test (or a local
flag the test names, bound once above) says ``P`` is missing or too small
(``P is None``, ``P.shape[i] < n``, ``P.numel() < n``, ``len(P) < n``); the
function returns ``P`` (alone or in a tuple); every call (one or more,
resolved; for a production helper, the calls in tests are not counted, and
one production call is needed) passes ``self.x`` for ``P`` and stores the
call's value in that ``self.x`` (alone or first of a tuple target). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..globs import test_path
from ..model import Site, Tier
from .host_params import every_caller_binds
from .index import Func, ProjectIndex, last_name
from .retier import Decision, python_device_site, retier

_MEMBER = re.compile(r"self\.[A-Za-z_]\w*")


def grown_params(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[tuple[str, str], bool] = {}

    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T4) and bool(site.target) and (site.target or "").isidentifier()

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        param = (site.target or "").strip()
        if func is None or func.scope is None or param not in func.scope.params:
            return None
        test = _miss_test(func, param, site.span.line)
        if not test or not any(param in _parts(r.value) for r in func.returns):
            return None
        key = (func.id, param)
        if key not in memo:
            in_test = test_path(func.path)  # a test's calls do not decide a production helper's lifetime
            kept: list[bool] = []

            def stored(c: Func, passed: tuple[str, ...], line: int) -> bool:
                if test_path(c.path) and not in_test:
                    return True
                kept.append(_stored_back(c, passed[0], line, func.name))
                return kept[-1]

            memo[key] = every_caller_binds(func, (param,), index, stored) and bool(kept)
        if not memo[key]:
            return None
        return Tier.T2, (f"grown on demand: {func.qualname} rebuilds {param} only when `{_short(test)}` says the "
                         f"one handed in is missing or too small, and every caller keeps what it returns in the "
                         f"member it handed in: persistent (was: {site.tier_reason})")

    return retier(sites, eligible, decide)


def _miss_test(func: Func, param: str, line: int) -> str:
    """The test of an ``if`` around ``line`` that says ``param`` is missing or too small."""
    miss = re.compile(rf"\b{re.escape(param)}\s+is\s+None\b|\b{re.escape(param)}\.(?:shape\[\d+\]|numel\(\))\s*<"
                      rf"|\blen\(\s*{re.escape(param)}\s*\)\s*<")
    for block in func.blocks:
        if block.kind != "if" or not block.span.contains_line(line):
            continue
        test = block.test.strip()
        if test.isidentifier():  # a flag bound once above: `needs_realloc = (storage is None or ...)`
            bound = [a for a in func.assigns if test in a.targets]
            test = bound[0].value if len(bound) == 1 and bound[0].line < block.span.line else ""
        if test and miss.search(test) is not None:
            return test
    return ""


def _stored_back(caller: Func, passed: str, line: int, name: str) -> bool:
    """The caller passes ``self.x`` and stores the call's value (or its first element) back in ``self.x``."""
    if _MEMBER.fullmatch(passed) is None:
        return False
    for call in caller.calls:
        if call.span.line <= line <= call.span.end_line and last_name(call.callee) == name:
            target = (call.target or "").strip()
            if not target:  # a parenthesised value: `self.a, self.b = (ensure(...))`
                head = re.compile(rf"\(*\s*(?:[\w.]+\.)?{re.escape(name)}\s*\(")
                held = [a.targets for a in caller.assigns
                        if call.span.line - 2 <= a.line <= call.span.line and head.match(a.value.strip())]
                target = ",".join(held[0]) if len(held) == 1 else ""
            return bool(target) and target.strip("()").split(",")[0].strip() == passed
    return False


def _parts(value: str) -> set[str]:
    return {p.strip() for p in value.strip().strip("()").split(",")}


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."
