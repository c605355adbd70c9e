"""Stage 5, after the run-once pass: an entry made only when its key is
missing from a container that outlives the call.

Input: classified sites and the project index. Output: the same sites, a
per-call Python buffer (device T4, pinned T5a) re-tiered when it is stored
into ``C[key]`` (directly, or a local that a later statement of the
function stores there, alone or in a tuple: ``hit = C[key] = (ids, g)``;
a value of the literal a local is bound to: ``out = {"ids": torch.arange(n)}``)
under a test that the entry is missing (``if key not in C:``, or ``if hit
is None:`` with ``hit = C.get(key)``, or after a guard clause ``if hit is
not None: return hit``; round 35: the ``else`` of ``if key in C:``, and
``C.keys()`` read as ``C``), where ``C`` is

- a dict the module binds at module level (``_CACHE: dict = {}``): the
  entry lives for the process;
- a container the object holds (``self._store``), or a local bound to one
  or to an entry of one (``group = self._store[tag]``): the entry lives
  with the object;
- (round 24) a parameter of a plain function, or a local bound to an entry
  of one (``cache = input_dict["dev_cache"]``), where every caller hands in
  a dict its module binds at module level (``get_for_device(_ARANGES, r,
  d)``): the entry lives for the process.

The test may name a sibling container the object holds, keyed the same,
when the guarded block stores that key there too (``if m not in
self._counts: self._stats[m] = make_stats(m); self._counts[m] = 0``): the
entry is made once per key either way. Derived sites (a project factory's
result stored so) are read the same way, and so (round 24) is a buffer a
function returns when every caller stores what it returns so (``mat =
random_matrix(dim, d)``; ``_CACHE[dim] = mat`` after the guard clause ``if
dim in _CACHE: return _CACHE[dim]``): made once per key, kept for the
process. (Round 35) A chained store (``_ENGINES[key] = eng =
GroupedGemm(...)``) stores the call's target: the extractor records the
entry as bound to it (``extract/python_statements.py``).

A device buffer so cached is persistent (T2); a pinned one is kept and
reused by the later calls (T5b). A container another caller hands in, or
one the function builds, may be per call: left as it is. The run-once pass
already takes a constant key on ``self`` (``if "v" not in self.state``).
DESIGN.md ("Lifetime tiers"): set up once and kept -> persistent. One
compiled pattern read by captures (no per-name compile); a function with
no subscripted store is not read further.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..arglists import split_args
from ..globs import test_path
from ..model import Language, Site, SiteKind, Span, Tier
from .index import Func, ProjectIndex
from .names import IDENTIFIER

_EMPTY_DICT = re.compile(r"\{\s*\}|(?:collections\.)?(?:dict|OrderedDict|defaultdict\(\w*\))\(\s*\)")
_SUBSCRIPT = re.compile(r"^([A-Za-z_][\w.]*)\[(.*)\]$")
# `k not in C`, `C.get(k)`
# (round 35: `k in C.keys()` tests the same entry)
_MISSING = re.compile(r"^\(?\s*(.+?)\s+not\s+in\s+([A-Za-z_][\w.]*)(?:\.keys\(\))?\s*\)?\s*$")
_PRESENT = re.compile(r"^\(?\s*(.+?)\s+in\s+([A-Za-z_][\w.]*)(?:\.keys\(\))?\s*\)?$")  # `k in C`
_HIT = re.compile(r"\(?\s*(?:(\w+)\s+is\s+not\s+None|(\w+))\s*\)?")
_ABSENT = re.compile(r"\(?\s*\w+\s+is\s+None\s*\)?|\(?\s*not\s+\w+\s*\)?")


def keyed_caches(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    globals_: dict[str, frozenset[str]] = {}
    return [_cached(site, index, globals_) if _candidate(site) else site for site in sites]


def _candidate(site: Site) -> bool:
    return (site.language is Language.PYTHON and site.scope != "<module>"
            and ((site.kind is SiteKind.DEVICE and site.tier is Tier.T4)
                 or (site.kind is SiteKind.PINNED_HOST and site.tier is Tier.T5A)))


def _module_dicts(path: str, index: ProjectIndex, memo: dict[str, frozenset[str]]) -> frozenset[str]:
    found = memo.get(path)
    if found is None:
        module = index.func(path, "<module>")
        found = memo[path] = frozenset(
            t for a in (module.assigns if module is not None else ()) if a.op == "="
            and _EMPTY_DICT.fullmatch(a.value.strip()) for t in a.targets if t.isidentifier())
    return found


def _cached(site: Site, index: ProjectIndex, memo: dict[str, frozenset[str]]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None:
        return site
    found = _cache_entry(func, (site.target or "").strip(), site.stmt_line, site.span.line, index, memo)
    if found is None and site.kept == "return" and func.scope is not None \
            and func.scope.role in ("function", "method"):
        found = _cached_by_callers(func, index, memo)
    if found is None:
        return site
    container, where, test = found
    if site.kind is SiteKind.PINNED_HOST:
        return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
            f"persistent pinned host buffer cached in {container}[...] ({where}): {site.scope} makes it only when "
            f"`{test}` says the entry is missing and reuses it after (was: {site.tier_reason})"))
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"cached in {container}[...] ({where}): {site.scope} makes it only when `{test}` says the entry is "
        f"missing, and later calls reuse it: persistent (was: {site.tier_reason})"))


def _cache_entry(func: Func, target: str, stmt_line: int, line: int, index: ProjectIndex,
                 memo: dict[str, frozenset[str]]) -> tuple[str, str, str] | None:
    """The container, why it outlives the call and the missing-entry test,
    when ``func`` stores the value made at ``line`` (bound to ``target``)
    in an entry made only when its key is missing; None otherwise."""
    if not (_SUBSCRIPT.match(target) or any(_SUBSCRIPT.match(t) for a in func.assigns for t in a.targets)):
        return None
    container, key = _stored_in(target, stmt_line, line, func)
    if not container:
        return None
    where = _owner(container, func, line, _module_dicts(func.path, index, memo), index, memo)
    if not where:
        return None
    test = _missing_test(container, key, func, line)
    return (container, where, test) if test else None


def _cached_by_callers(func: Func, index: ProjectIndex,
                       memo: dict[str, frozenset[str]]) -> tuple[str, str, str] | None:
    """``func`` returns the buffer, and every caller (one at least; tests of
    production code aside) stores
    what each of its calls of ``func`` returns in an entry made only when its
    key is missing (``mat = random_matrix(dim, d)`` then ``_CACHE[dim] = mat``
    after ``if dim in _CACHE: return ...``): the first of those."""
    found = None
    for fid, distance in index.callers_within([func], 1).items():
        caller = index.funcs.get(fid)
        if distance != 1:
            continue
        if caller is None:
            return None
        if test_path(caller.path) and not test_path(func.path):
            continue  # a test calling it once says nothing of how production code keeps it
        calls = [c for c in caller.calls
                 if c.callee.rsplit(".", 1)[-1] == func.name and func in index.resolve(caller, c)]
        if not calls:
            return None
        for call in calls:
            entry = _cache_entry(caller, (call.target or "").strip(), 0, call.span.line, index, memo)
            if entry is None:
                return None
            found = found or (entry[0], f"{entry[1]}, filled by {caller.qualname} with what it returns", entry[2])
    return found


def _stored_in(target: str, stmt_line: int, line: int, func: Func) -> tuple[str, str]:
    """The container whose entry holds the buffer and the key's text: the
    site's own target ``C[k]``, or one a later statement stores its local in."""
    m = _SUBSCRIPT.match(target)
    if m is not None:
        return m.group(1), m.group(2).strip()
    if not target and stmt_line:  # a value of a literal: `result = {"ids": torch.arange(n)}`
        held = [a.targets[0] for a in func.assigns if a.line == stmt_line and len(a.targets) == 1]
        target = held[0].strip() if len(held) == 1 else ""
    if not target.isidentifier():
        return "", ""
    for a in func.assigns:
        if a.line < line or a.op != "=":
            continue
        parts = {p.strip() for p in a.value.strip().strip("()").split(",")}
        if target not in parts:
            continue
        for t in a.targets:
            if (m := _SUBSCRIPT.match(t)) is not None:
                return m.group(1), m.group(2).strip()
    return "", ""


def _owner(container: str, func: Func, line: int, module_dicts: frozenset[str],
           index: ProjectIndex | None = None, memo: dict[str, frozenset[str]] | None = None) -> str:
    """Why the container outlives the call, or ""."""
    if container in module_dicts and container not in _locals(func):
        return "a dict bound at module level"
    if container.startswith(("self.", "cls.")):
        return "held by the object"
    bound = [a for a in func.assigns if a.targets == (container,) and a.line < line]
    if bound and bound[-1].value.strip().startswith(("self.", "cls.")):
        return f"{bound[-1].value.strip()}, held by the object"
    root = IDENTIFIER.match(bound[-1].value.strip() if bound else container)
    if root is not None and index is not None and memo is not None \
            and (handed := _module_dict_handed(func, root.group(0), index, memo)):
        return handed
    return ""


def _module_dict_handed(func: Func, param: str, index: ProjectIndex, memo: dict[str, frozenset[str]]) -> str:
    """Every caller of ``func`` (one at least) hands a dict its module binds
    at module level in as ``param`` (``get_for_device(buffered_aranges, r,
    d)``, the container or the holder of an entry that is): "" otherwise."""
    params = func.scope.params if func.scope is not None else ()
    if param not in params or param in ("self", "cls") or (func.scope is not None and func.scope.role != "function"):
        return ""
    position = params.index(param)
    names: set[str] = set()
    for fid, distance in index.callers_within([func], 1).items():
        caller = index.funcs.get(fid)
        if distance != 1:
            continue
        calls = [c for c in caller.calls if c.callee.rsplit(".", 1)[-1] == func.name
                 and func in index.resolve(caller, c)] if caller is not None else []
        if caller is None or not calls:
            return ""
        for call in calls:
            args = split_args(call.arglist)
            named = [a.text for a in args if a.keyword == param]
            given = named[0] if named else (args[position].text if position < len(args)
                                             and all(a.keyword is None for a in args[:position + 1]) else "")
            if given not in _module_dicts(caller.path, index, memo) or given in _locals(caller):
                return ""
            names.add(given)
    return f"a dict bound at module level that every caller hands in ({', '.join(sorted(names))})" if names else ""


def _locals(func: Func) -> set[str]:
    params = func.scope.params if func.scope is not None else ()
    return set(params) | {t for a in func.assigns for t in a.targets if t.isidentifier()}


def _missing_test(container: str, key: str, func: Func, line: int) -> str:
    """The test of an ``if`` around ``line`` that says the entry stored
    under ``key`` is missing (a test on another key, ``f"{key}{suffix}"``
    stored under ``key not in C``, says nothing)."""
    probes = {c.target.strip() for c in func.calls if c.target and c.span.line < line
              and c.callee == f"{container}.get" and c.target.strip().isidentifier()
              and c.arglist.split(",")[0].strip() == key}
    for block in func.blocks:
        if block.kind == "if" and block.exits and block.span.end_line < line:
            # a guard clause on the entry: `if key in C: return C[key]`
            hit = _PRESENT.fullmatch(" ".join(block.test.split()))
            if hit is not None and hit.group(1).strip() == key and hit.group(2) == container:
                return f"not ({block.test})"
        if block.kind == "if" and block.exits and block.span.end_line < line and probes:
            # a guard clause on a hit: `if hit is not None: return hit`
            hit = _HIT.fullmatch(" ".join(block.test.split()))
            if hit is not None and (hit.group(1) or hit.group(2)) in probes:
                return f"not ({block.test})"
        if block.kind == "else" and block.span.contains_line(line):
            # round 35: the `else` of `if key in C:` (`if H in self.masks.keys(): ... else: self.masks[H] = ...`)
            head = next((b for b in func.blocks if b.kind == "if" and b.stmt == block.stmt), None)
            hit = _PRESENT.fullmatch(" ".join(head.test.split())) if head is not None else None
            if head is not None and hit is not None and hit.group(1).strip() == key and hit.group(2) == container:
                return f"not ({head.test})"
        if block.kind not in ("if", "elif") or not block.span.contains_line(line):
            continue
        test = " ".join(block.test.split())
        m = _MISSING.match(test)
        if m is not None and m.group(1).strip() == key and (
                m.group(2) == container or _sibling(m.group(2), container, key, func, block.span)):
            return test
        if probes and _ABSENT.fullmatch(test) is not None \
                and probes & set(IDENTIFIER.findall(test)):
            return test
    return ""


def _sibling(guarded: str, container: str, key: str, func: Func, span: Span) -> bool:
    """``guarded`` is another container of the object, and the block stores
    ``key`` into it: the test stays false for that key from then on."""
    if not (guarded.startswith("self.") and container.startswith("self.")):
        return False
    entry = f"{guarded}[{key}]"
    return any(entry in a.targets and a.op == "=" and span.contains_line(a.line) for a in func.assigns) or any(
        (c.target or "").strip() == entry and span.contains_line(c.span.line) for c in func.calls)
