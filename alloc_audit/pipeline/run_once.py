"""Stage 5, classify (after the lazy members): set-up work a flag or a
membership test makes run once.

Input: classified sites and the project index. Output: the same sites, the
per-call (T4) Python sites that run once per object re-tiered T2 with a
reason naming the test.

A method that sets up state on the object runs once, though the method
that calls it runs per step, when a flag on the object says so:

- every call of the method in its class sits under a test that the flag
  is unset (``if not self._built: self._build_buffers()``) and the method
  sets the flag (``self._built = True``);
- the method returns early when the flag is set (``if self._done:
  return``) and sets it itself: what follows the guard clause runs once.

An entry of a container created under a test that its key is missing
(``if "v" not in group: group["v"] = [...]; group["v"][0] = torch.zeros(n)``)
is created once and kept in the container. In C++, an allocation under a
test on a function-local ``static`` (``if (!allocated || rows != setup_rows)``:
re-made only when the shape the statics remember changed), or a call that
fills a function-local ``static`` pointer through its address
(``set_up(&d_matrix, rows)`` with ``static float* d_matrix;``), is a cache
kept for the process; so is an allocation of a native program's ``main``
outside its loops (like module-level code). DESIGN.md ("Lifetime tiers"):
set up once and kept ->
persistent. A temporary (kept nowhere) stays per call.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex

_FLAG_UNSET = re.compile(r"^\(?\s*not\s+self\.(\w+)\s*\)?$|^\(?\s*self\.(\w+)\s+is\s+False\s*\)?$")
_FLAG_SET = re.compile(r"^\(?\s*self\.(\w+)\s*\)?$|^\(?\s*self\.(\w+)\s+is\s+True\s*\)?$")
_ENTRY = re.compile(r"""^(\w+(?:\.\w+)*)\[\s*(["'][^"']+["'])\s*\]""")


def run_once(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    return [_once(site, index) if _candidate(site) else
            _native_static(site, index) if _native(site) else site for site in sites]


def _native(site: Site) -> bool:
    return (site.tier is Tier.T4 and site.language is not Language.PYTHON and site.kind is not SiteKind.RELEASE
            and site.kind is not SiteKind.PINNED_HOST and site.kept not in ("local", "return"))


def _native_static(site: Site, index: ProjectIndex) -> Site:
    func = index.func(site.path, site.scope)
    if func is None:
        return site
    if func.qualname == "main" and site.via is None and not func.in_loop(site.span.line):
        return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"process entry point main: allocated once for the run, outside any loop ({site.tier_reason})"))
    statics = _statics(func)
    if not statics:
        return site
    names = "|".join(re.escape(n) for n in sorted(statics))
    if site.via is not None:
        filled = re.compile(rf"&\s*(?:{names})\b")
        for call in func.calls:
            if call.span.line == site.span.line and filled.search(call.arglist):
                return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
                    f"cached in a function-local static: {site.scope} hands the address of a static pointer "
                    f"to {call.callee}, which fills it: kept for the process ({site.tier_reason})"))
        return site
    state = statics & {t for a in func.assigns if not a.type for t in a.targets}  # updated: remembered state
    if not state:
        return site
    named = re.compile(rf"(?<![\w.>])(?:{'|'.join(re.escape(n) for n in sorted(state))})\b")
    for block in func.blocks:
        if block.kind in ("if", "elif") and block.span.contains_line(site.span.line) and named.search(block.test):
            return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
                f"cached: {site.scope} re-makes it only when its function-local statics say it is missing or "
                f"stale (`{_short(block.test)}`): kept for the process ({site.tier_reason})"))
    return site


def _statics(func: Func) -> set[str]:
    """The function-local statics (``static``, ``thread_local``) not
    declared ``const``."""
    return {t for a in func.assigns if a.type and a.type.startswith("static ") and "const" not in a.type
            for t in a.targets}


def _short(test: str) -> str:
    text = " ".join(test.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _candidate(site: Site) -> bool:
    return (site.tier is Tier.T4 and site.kind is SiteKind.DEVICE and site.language is Language.PYTHON
            and _stored(site.target or "") and site.kept not in ("local", "return")
            and not site.kept.startswith("handed:"))


def _stored(target: str) -> bool:
    """Stored into a member or an entry (``self.x``, ``group["v"]``), not
    bound to a plain local (a temporary of the set-up work)."""
    return "." in target or "[" in target


def _once(site: Site, index: ProjectIndex) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in ("function", "method"):
        return site
    test = _keyed_entry(site, func)
    if test:
        return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"created once: stored in an entry made only when `{test}` says it is missing, and kept there: "
            f"persistent ({site.tier_reason})"))
    flag = _guard_clause_flag(site, func) or _callers_flag(func)
    if flag:
        return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"set up once: {func.qualname} runs only while self.{flag} is unset and sets it; kept: "
            f"persistent ({site.tier_reason})"))
    return site


def _keyed_entry(site: Site, func: Func) -> str:
    """The test around the site that the constant key it is stored under
    is missing from the container (``if "v" not in group:``); the container
    is the object's, or the site runs in a loop over a member of the object
    (``for group in self.param_groups:``)."""
    m = _ENTRY.match((site.target or site.kept).strip())
    if m is None:
        return ""
    owner, key = m.groups()
    if not owner.startswith(("self.", "cls.")) and not any(  # a dict handed in (`kwargs`) may be per call
            b.kind == "loop" and b.test.strip().startswith(("self.", "cls.")) and b.span.contains_line(site.span.line)
            for b in func.blocks):
        return ""
    missing = re.compile(rf"^\(?\s*{re.escape(key)}\s+not\s+in\s+{re.escape(owner)}\s*\)?$")
    for block in func.blocks:
        if block.kind in ("if", "elif") and block.span.contains_line(site.span.line) and missing.match(block.test):
            return " ".join(block.test.split())
    return ""


def _sets_flag(func: Func, flag: str) -> bool:
    target = f"self.{flag}"
    return any(a.op == "=" and a.value.strip() == "True" and target in a.targets for a in func.assigns)


def _guard_clause_flag(site: Site, func: Func) -> str:
    """``if self._done: return`` before the site, with the method setting
    ``self._done = True``."""
    for block in func.blocks:
        if block.kind != "if" or not block.exits or block.span.end_line >= site.span.line:
            continue
        m = _FLAG_SET.match(block.test.strip())
        flag = (m.group(1) or m.group(2)) if m is not None else None
        if flag and _sets_flag(func, flag):
            return flag
    return ""


def _callers_flag(func: Func) -> str:
    """The flag every call of the method in its class is guarded by
    (``if not self._built: self._build()``), set by the method."""
    owner = func.owner
    if owner is None:
        return ""
    flag = ""
    called = False
    for methods in owner.methods.values():
        for method in methods:
            for call in method.calls:
                if call.callee != f"self.{func.name}":
                    continue
                called = True
                found = _unset_test(method, call.span.line)
                if not found or (flag and found != flag):
                    return ""
                flag = found
    return flag if called and _sets_flag(func, flag) else ""


def _unset_test(method: Func, line: int) -> str:
    for block in method.blocks:
        if block.kind == "if" and block.span.contains_line(line):
            m = _FLAG_UNSET.match(block.test.strip())
            if m is not None:
                return m.group(1) or m.group(2)
    return ""
