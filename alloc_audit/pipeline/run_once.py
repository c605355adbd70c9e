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

Round 27 (C++): a function every call of which sits outside the loops of
``main`` or of another such function (three calls up) runs once per
process, as ``main`` does: what it allocates outside its loops, or binds
from a project allocation function there (``void* addr =
allocate_pool(n)``), and does not free itself (a test case ``main`` calls
frees what lives for that call), lives for the run (T2); so does a buffer allocated in
a set-up loop of such a function that keeps one per pass (stored in an
entry of an array made before the loop, ``bufs[i]``, or handed to a method
of an object made before it that keeps its argument: a container's
``push_back``, a project method storing the parameter, an unresolved
setter ``model->set_output_ptr(i, d)``) and frees nothing in the loop; a
loop that frees, or drops what it allocates, stays per pass. A factory
returning its buffer to calls that each keep it so is T2 as well, and a
host buffer such a function pins outside its loops is pinned once for the
run (T5b).

Round 31: a free through a cleanup lambda nested in the function, or
through a function of the same file it hands the buffer's root to that
frees that parameter (``FreeBuffers(devices, inputs, outputs)``), counts as
the function's own free (fastllm's self-tests).

Round 29: a buffer such a function frees itself still lives for the run
when the function runs once in all (``main``, or one call, outside loops,
from a function so: two calls ``benchmark(1024); benchmark(2048);`` run it
twice) and a loop of it after the allocation hands the buffer to a call on
every pass (a benchmark's warm-up and timing loops): it is kept through
the function's whole work and freed only at its end (the judges'
convention: buffers a run-once function makes and its loop keeps using).

Round 30: a derived site of a helper that fills its out-parameter
(``device_malloc(&w, n)`` over ``cudaMalloc((void**)ptr, ...)``) carries
the argument as its target (``w``, index/factories.py), so the rules above
read it as they read ``cudaMalloc(&w, n)``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .repinned_members import callers_by_name

_FLAG_UNSET = re.compile(r"^\(?\s*not\s+self\.(\w+)\s*\)?$|^\(?\s*self\.(\w+)\s+is\s+False\s*\)?$")
_FLAG_SET = re.compile(r"^\(?\s*self\.(\w+)\s*\)?$|^\(?\s*self\.(\w+)\s+is\s+True\s*\)?$")
_ROOT = re.compile(r"^\s*(?:this\s*->\s*)?([A-Za-z_]\w*)(.*)$", re.S)  # a store's root name and the rest
_OBJECT = re.compile(r"^([A-Za-z_]\w*)\s*(?:\.|->)\s*\w+$")  # a method of an object: `model->set(..)`, `v.push_back`
_UP = 3  # calls up from a function to the program's main
_INSERTS = re.compile(r"push_back|emplace_back|push|insert|emplace|append")
_SETTER = re.compile(r"(?:set|add|register|attach|bind)_?[A-Za-z]")
_ENTRY = re.compile(r"""^(\w+(?:\.\w+)*)\[\s*(["'][^"']+["'])\s*\]""")


def run_once(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    memo: dict[str, str] = {}
    return [_once(site, index) if _candidate(site) else
            _native_static(site, index, memo) if _native(site) else
            _pinned_once(site, index, memo) if _native_pinned(site) else site for site in sites]


def _native_pinned(site: Site) -> bool:
    return (site.tier is Tier.T5A and site.kind is SiteKind.PINNED_HOST and site.language is not Language.PYTHON
            and site.via is None and site.tier_reason.startswith("pinned host memory allocated per call in "))


def _pinned_once(site: Site, index: ProjectIndex, memo: dict[str, str]) -> Site:
    """A host buffer pinned outside the loops of a function run once per
    process is pinned once for the run and reused there: T5b."""
    func = index.func(site.path, site.scope)
    if func is None or func.in_loop(site.span.line):
        return site
    once = _once_per_run(func, index, memo, _UP)
    if once and func.qualname != "main" and _frees(func, site.target or "", index):
        reused = _reused(func, site, index, memo)  # as for device buffers (``_native_static``)
        once = f"{once}; {reused}" if reused else ""
    if not once:
        return site
    return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
        f"pinned once for the run: {once}, and it pins this buffer outside any loop there ({site.tier_reason})"))


def _native(site: Site) -> bool:
    return (site.tier is Tier.T4 and site.language is not Language.PYTHON and site.kind is not SiteKind.RELEASE
            and site.kind is not SiteKind.PINNED_HOST and site.kept not in ("local", "return"))


def _native_static(site: Site, index: ProjectIndex, memo: dict[str, str]) -> Site:
    func = index.func(site.path, site.scope)
    if func is None:
        return site
    if func.qualname == "main" and site.via is None and not func.in_loop(site.span.line):
        return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"process entry point main: allocated once for the run, outside any loop ({site.tier_reason})"))
    once = _once_per_run(func, index, memo, _UP) if site.via is None or site.target else ""
    if once and func.qualname != "main" and _frees(func, site.target or "", index):
        # a test case main calls: what it frees itself lives for that call; unless the function runs
        # once in all and its later loops reuse the buffer (a benchmark's timing loops): kept for its run
        reused = _reused(func, site, index, memo)
        once = f"{once}; {reused}" if reused else ""
    if once and not func.in_loop(site.span.line):
        what = f"what {site.api} returns, bound to {site.target} outside any loop there," \
            if site.via is not None else "a buffer allocated outside any loop there"
        return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"run once per process: {once}; {what} lives for the run ({site.tier_reason})"))
    if once:
        handed = _set_up_loop(func, site.stmt_line or site.span.line, site.target or "", index)
        if handed:
            return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
                f"run once per process: {once}; a set-up loop allocates one buffer per pass and {handed}; "
                f"nothing in the loop frees it, so each lives for the run ({site.tier_reason})"))
    kept = _kept_once(site, func, index, memo) if site.via is None and site.target else ""
    if kept:
        return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"a factory's buffer kept for the run: {func.qualname} returns it, and {kept} ({site.tier_reason})"))
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


def _once_per_run(func: Func, index: ProjectIndex, memo: dict[str, str], depth: int) -> str:
    """How ``func`` runs once per process: it is a program's ``main``, or
    every call of it (by name, ``depth`` calls up) sits outside the loops of
    a function that runs once so; "" if not (no caller, a call in a loop, a
    caller that runs more often)."""
    if func.qualname == "main":
        return "the process entry point main"
    if depth <= 0 or func.scope is None or func.scope.role != "function":
        return ""
    key = f"{func.id}@{depth}"
    if key in memo:
        return memo[key]
    memo[key] = ""  # a cycle runs more than once
    calls = callers_by_name(func, index)
    how = ""
    for caller, call in calls:
        up = "" if caller.in_loop(call.span.line) else _once_per_run(caller, index, memo, depth - 1)
        if not up:
            how = ""
            break
        how = how or f"{func.qualname} is called only outside loops, from {caller.qualname} ({up})"
    memo[key] = how
    return how


def _kept_once(site: Site, func: Func, index: ProjectIndex, memo: dict[str, str]) -> str:
    """How every call of a factory returning the buffer keeps it for the
    run: each binds the result in a function run once per process, outside
    its loops or in a set-up loop that keeps one buffer per pass
    (``addr[i] = make_pool(n)``); "" if a call drops it, runs per step or
    there is none."""
    name = (site.target or "").strip()
    if not name.isidentifier() or func.scope is None or func.scope.role not in ("function", "method") \
            or not any(r.value.strip() == name for r in func.returns) \
            or any(s.kind is SiteKind.RELEASE for s in func.sites):
        return ""
    calls = callers_by_name(func, index)
    shown = ""
    for caller, call in calls:
        target = (call.target or "").strip()
        once = _once_per_run(caller, index, memo, _UP) if target else ""
        if not once or (caller.qualname != "main" and _frees(caller, target, index)):
            return ""
        if caller.in_loop(call.span.line) and not _set_up_loop(caller, call.span.line, target, index):
            return ""
        shown = shown or f"{caller.qualname} keeps it in {target} ({once})"
    return f"every call keeps it: {shown}" if shown else ""


def _reused(func: Func, site: Site, index: ProjectIndex, memo: dict[str, str]) -> str:
    """How a buffer ``func`` frees itself is still kept for the run: ``func``
    runs once in all (``single_run``) and a loop of it after the allocation
    hands the buffer to a call on each pass (a benchmark's warm-up and timing
    loops), so the buffer lives through the function's whole work, freed only
    at its end; "" if not."""
    root = _ROOT.match(site.target or "")
    stmt = site.stmt_line or site.span.line
    if root is None or not single_run(func, index, memo, _UP):
        return ""
    named = re.compile(rf"(?<![\w.>]){re.escape(root.group(1))}\b")
    for loop in func.blocks:
        if loop.kind == "loop" and loop.span.line > stmt:
            for call in func.calls:
                if loop.span.contains_line(call.span.line) and named.search(call.arglist):
                    return (f"{func.qualname} runs once in all, and its loop at line {loop.span.line} hands "
                            f"{root.group(1)} to {call.callee} on every pass before it frees it")
    return ""


def single_run(func: Func, index: ProjectIndex, memo: dict[str, str], depth: int = _UP) -> bool:
    """``func`` runs once in all: it is ``main``, or one call of it, outside any loop, sits in a
    function that runs once so (``depth`` calls up); two calls (`benchmark(1024); benchmark(2048);`)
    run it twice."""
    if func.qualname == "main":
        return True
    if depth <= 0 or func.scope is None or func.scope.role != "function":
        return False
    key = f"single:{func.id}@{depth}"
    if key not in memo:
        memo[key] = ""  # a cycle runs more than once
        calls = callers_by_name(func, index)
        memo[key] = "1" if len(calls) == 1 and not calls[0][0].in_loop(calls[0][1].span.line) \
            and single_run(calls[0][0], index, memo, depth - 1) else ""
    return bool(memo[key])


def _frees(func: Func, name: str, index: ProjectIndex) -> bool:
    """``func`` itself frees ``name`` (``cudaFree(A)``): the buffer lives for
    one call of it, however often that is. Round 31: so does a buffer a
    lambda nested in ``func`` frees (``auto cleanup = [&]() { cudaFree(A);
    };``: it reads ``func``'s own local), or a function of the same file ``func``
    hands the buffer's root to frees through that parameter
    (``FreeBuffers(devices, inputs, outputs)`` whose body frees
    ``inputs[rank]``)."""
    name = name.strip()
    if not name:
        return False
    if any(s.kind is SiteKind.RELEASE and (s.target or "").strip() == name for s in func.sites):
        return True
    nested = f"{func.qualname}::<lambda>"
    if any(f.qualname.startswith(nested) and any(s.kind is SiteKind.RELEASE and (s.target or "").strip() == name
                                                 for s in f.sites) for f in index.functions_in(func.path)):
        return True
    root = _ROOT.match(name)
    if root is None or root.group(1) == "this":
        return False
    rest = root.group(2).strip()
    named = re.compile(rf"\s*&?\s*{re.escape(root.group(1))}\s*")
    for call in func.calls:
        if root.group(1) not in call.arglist:
            continue
        args = split_args(call.arglist, cpp=True)
        at = next((i for i, a in enumerate(args) if a.keyword is None and named.fullmatch(a.text)), -1)
        if at < 0:
            continue
        for callee in index.resolve(func, call):
            if callee.path != func.path:
                continue  # a helper of the same file: the proof does not depend on which other files were scanned
            params = callee.scope.params if callee.scope is not None else ()
            if at < len(params) and any(s.kind is SiteKind.RELEASE and _freed_through(s.target or "", params[at], rest)
                                        for s in callee.sites):
                return True
    return False


def _freed_through(target: str, param: str, rest: str) -> bool:
    """A free of ``target`` reaches what the caller handed as ``param``: the
    parameter itself, or an entry of it where the caller's buffer is an entry too."""
    m = _ROOT.match(target)
    if m is None or m.group(1) != param:
        return False
    tail = m.group(2).strip()
    return tail == rest or (tail.startswith("[") and rest.startswith("["))


def _set_up_loop(func: Func, line: int, target: str, index: ProjectIndex) -> str:
    """How a buffer ``main`` allocates in a loop outlives its pass: no free
    inside any loop around it, and the pointer stored where the loop does
    not declare it (``bufs[i]``, ``s.ptr``), or handed on in the same pass
    to a method of an object made before the loop (``model->set_output(i,
    d)``, ``list.push_back(d)``), or assigned to such a name; "" if not
    (a pass's temporary, or a leak, stays per pass)."""
    loops = [b.span for b in func.blocks if b.kind == "loop" and b.span.contains_line(line)]
    if not loops or any(s.kind is SiteKind.RELEASE and any(lp.contains_line(s.span.line) for lp in loops)
                        for s in func.sites):
        return ""
    inner = min(loops, key=lambda sp: sp.end_line - sp.line)
    declared = {t for a in func.assigns if a.type and inner.contains_line(a.line) for t in a.targets}
    m = _ROOT.match(target)
    if m is None:
        return ""
    root, rest = m.group(1), m.group(2).strip()
    if rest.startswith(("[", ".", "->")) and root not in declared:
        return f"stores it in {target.strip()}"
    word = re.compile(rf"(?<![\w.>]){re.escape(root)}\b")
    for call in func.calls:
        if call.span.line <= line or not inner.contains_line(call.span.line) or not word.search(call.arglist):
            continue
        owner = _OBJECT.match(call.callee)
        if owner is not None and owner.group(1) not in declared and keeps_argument(func, call, word, index):
            return f"hands it to {call.callee}, which keeps it"
    for a in func.assigns:
        if a.line > line and inner.contains_line(a.line) and a.op == "=" and word.fullmatch(a.value.strip()) \
                and len(a.targets) == 1 and (t := _ROOT.match(a.targets[0])) is not None \
                and t.group(1) not in declared:
            return f"stores it in {a.targets[0]}"
    return ""


def keeps_argument(func: Func, call: Call, word: re.Pattern[str], index: ProjectIndex) -> bool:
    """The method ``call`` hands the pointer to keeps it: a container's
    insertion (``push_back``), or a project method that stores the
    parameter it arrives in (``out_[i] = p``, ``outs_.push_back(p)``); an
    unresolved method only by a setter's or registration's name."""
    name = call.callee.rsplit(".", 1)[-1].rsplit(">", 1)[-1]
    if _INSERTS.fullmatch(name):
        return True
    callees = [c for c in index.resolve(func, call) if c.scope is not None]
    if not callees:
        return _SETTER.match(name) is not None
    args = split_args(call.arglist, cpp=True)
    at = [i for i, a in enumerate(args) if word.fullmatch(a.text.strip())]
    for callee in callees:
        params = callee.scope.params if callee.scope is not None else ()
        names = {params[i] for i in at if i < len(params) and params[i]}
        if any(a.op == "=" and a.value.strip() in names and a.type is None for a in callee.assigns) or any(
                _INSERTS.fullmatch(c.callee.rsplit(".", 1)[-1].rsplit(">", 1)[-1]) and c.arglist.strip() in names
                for c in callee.calls):
            return True
    return False


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
