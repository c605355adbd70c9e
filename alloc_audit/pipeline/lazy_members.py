"""Stage 5, classify (after the callers): buffers created lazily on the object.

Input: classified sites and the project index. Output: the same sites, the
lazily created ones re-tiered T2 with a reason naming the test (T1 when
the member is one the class registers as a buffer, or a model's own table
moved back onto itself where the model's weights are: module state).

A buffer kept on the object (``self.x``) by a method that runs per step is
churned when it is stored on every call, but kept for the process when the
store sits under a test on the object's own state: the cache is missing or
stale or too small (``if self.x is None or self.x.shape != out.shape:``,
``if n > len(self.x):``, the ``else`` of
``if channel == self.channel: window = self.window``, after a guard clause
``if self.freqs is not None and ...: return``), or a dict on the object or
its class filled per key when the key is missing (``if device not in
cls.bounds: cls.bounds[device] = b.to(device)``; round 26: ``if
self.x.get(k) is None or self.x[k].numel() < n:``, or a state looked up
first and returned when there, ``st = self.x.get(k)``; ``if st is not None:
return st``, then built in a container literal and stored, ``st =
dict(buf=torch.empty(n))``; ``self.x[k] = st``). So is one set up under a branch with
no ``else`` and no test on the member, and read after the branch (``if do_prefill:
self.temp = torch.empty(...)`` ... ``out=self.temp[0]``): the calls that
skip the branch reuse it. DESIGN.md ("Lifetime
tiers"): kept in ``self.x`` -> persistent. A test on an argument alone, a
store with no test, or a temporary under the test stay per call.

Round 26: the holder may be an object the module keeps for the process,
named by its global name instead of ``self``: the enclosing class (a class
attribute, ``if Op.buf is None: Op.buf = ...`` in a static method) or the
enclosing module-level function (a function attribute, ``if not
hasattr(f, "_buf") or f._buf.numel() < n: f._buf = ...``), under the same
tests (``module_holder_test``; ``lifetimes`` keeps such a pinned copy,
T5b). An attribute of an object the call builds is no such holder.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .move_apis import TENSOR_MOVES
from .native_kept import native_kept
from .native_lazy import native_lazy_members

_IF_KINDS = frozenset({"if", "elif", "else"})
_KEYED = re.compile(r"((?:self|cls)\.[A-Za-z_]\w*)\[([^\[\]]+)\]")
_ADD = re.compile(r"(self\.[A-Za-z_]\w*)\.(?:append|extend|insert)")


def lazy_members(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    out = [_lazy(site, index) if _candidate(site) else site for site in sites]
    if not any(s.language is not Language.PYTHON for s in out):
        return out
    return native_kept(native_lazy_members(out, index), index)


def _candidate(site: Site) -> bool:
    return (site.tier is Tier.T4 and site.kind is SiteKind.DEVICE and site.language is Language.PYTHON
            and site.kept != "local")


def _lazy(site: Site, index: ProjectIndex) -> Site:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None or func.scope.role not in ("function", "method"):
        return site
    keyed = keyed_cache(site, func)
    if keyed:
        return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"created lazily: {func.qualname} keeps it per key in {keyed[0]} and builds it only when "
            f"`{_short(keyed[1])}` says the key is missing: persistent ({site.tier_reason})"))
    member = member_of(site, func)
    if member is None:
        held = module_holder_test(site, func)
        return site if held is None else dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"created lazily: {func.qualname} keeps it in {held[0]}, an attribute of a module-level "
            f"{held[2]}, and rebuilds it only when `{_short(held[1])}` says the cached one is missing or "
            f"stale: persistent ({site.tier_reason})"))
    test = _cache_test(site, func, _members(func) | {member})
    if not test:
        phase = _phase_setup(site, func, member)
        return site if not phase else dataclasses.replace(site, tier=Tier.T2, tier_reason=(
            f"set up once per phase: {func.qualname} keeps it in {member} only when `{_short(phase)}` and reads "
            f"it after that branch, so the calls that skip it reuse the kept buffer: persistent ({site.tier_reason})"))
    registration = registration_of_member(func, member)
    if registration:
        return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
            f"module state: created lazily in {member} (`{_short(test)}`), which its class registers as a buffer "
            f"({registration}); was: {site.tier_reason}"))
    module = _module_moving_own(site, func, member, index)
    if module:
        return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
            f"module state: {func.qualname} replaces {member} with its own copy moved to the device when "
            f"`{_short(test)}` says it is stale, and keeps it on {module}: it lives with the model; "
            f"was: {site.tier_reason}"))
    return dataclasses.replace(site, tier=Tier.T2, tier_reason=(
        f"created lazily: {func.qualname} keeps it in {member} and rebuilds it only when `{_short(test)}` says "
        f"the cached one is missing or stale: persistent ({site.tier_reason})"))


_WEIGHTS = re.compile(r"\bself(?:\.\w+)*\.(?:weight|parameters\(\))")


def _module_moving_own(site: Site, func: Func, member: str, index: ProjectIndex) -> str:
    """The model that keeps ``member`` as its state when the site moves
    the member itself to where the model's weights are and stores the copy
    back (``device = self.embed.weight.device`` ... ``self.freqs =
    self.freqs.to(device)``): the function reads the object's weights (a
    method of a model, or a function taking ``self`` bound onto a model as
    its ``forward``), and no method of its class but a constructor sets the
    member otherwise (a table made with the model, only moved). Empty when
    the member is a cache the class rebuilds (``self.pe = pe`` when too
    short) or the object has no weights in sight: a lazily kept buffer."""
    if site.api not in TENSOR_MOVES or (site.target or "").strip() != member or func.table is None:
        return ""
    table, pos = func.table, func.table.positions
    if not any(table.callees[i] in (f"{member}.to", f"{member}.cuda") for i in func.call_ix
               if pos[4 * i] == site.span.line and pos[4 * i + 1] == site.span.col):
        return ""
    params = func.scope.params if func.scope is not None else ()
    texts = [a.value for a in func.assigns] + [c.arglist for c in func.calls] + [c.callee for c in func.calls]
    if not params or params[0] != "self" or not any(_WEIGHTS.search(t) for t in texts):
        return ""
    owner = func.owner
    if owner is None:
        return "the model it is bound to (it reads the model's weights)"
    for methods in owner.methods.values():
        for method in methods:
            if method.scope is None or method.scope.role == "constructor":
                continue
            stores = [a.value.strip() for a in method.assigns if member in a.targets]
            calls = method.table
            if calls is not None:
                stores += [calls.callees[i] for i in method.call_ix if calls.targets[i] == member]
            if any(not v.startswith((f"{member}.to", f"{member}.cuda")) for v in stores):
                return ""
    return f"the model {owner.name} (it reads its weights)"


_HOLDER = re.compile(r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)")


def module_holder_test(site: Site, func: Func) -> tuple[str, str, str] | None:
    """Round 26: the site is stored in an attribute of an object the module
    holds for the process, named by its global name: the enclosing class
    (``if Op.buf is None: Op.buf = torch.empty(n)`` in a static method, a
    class attribute shared by every object) or the enclosing module-level
    function itself (``if not hasattr(gather, "_buf") or gather._buf.numel() <
    n: gather._buf = ...``, a function attribute), under a test that the
    cached member, or another the function stores on the same holder, is
    missing, stale or too small (``_miss`` read with the holder for
    ``self``). Returns the member, the test, and what holds it;
    None otherwise."""
    m = _HOLDER.fullmatch((site.target or "").strip())
    if m is None:
        return None
    root, attr = m.groups()
    owner = func.owner
    if owner is not None and root == owner.name and "." not in owner.qualname.replace("::", "."):
        what = "class"
    elif owner is None and root == func.name == func.qualname:
        what = "function"
    else:
        return None
    own = re.compile(rf"(?<![\w.]){re.escape(root)}\b")
    # a test on one of the members the function stores there decides (`_buffer` for `_cpu_buffer` beside it)
    stored = [t.strip() for a in func.assigns for t in a.targets] + [(c.target or "").strip() for c in func.calls]
    members = {f"self.{attr}"} | {"self." + t[len(root) + 1:] for t in stored
                                  if t.startswith(root + ".") and _HOLDER.fullmatch(t)}
    line = site.span.line
    for block in func.blocks:
        if block.kind in ("if", "elif") and block.span.contains_line(line) \
                and _miss(own.sub("self", block.test), members):
            return f"{root}.{attr}", block.test, what
    return None


def registration_of_member(func: Func, member: str) -> str:
    """The call by which a method of ``func``'s class registers ``member``
    as a buffer: ``self.register_buffer("x", ...)``, or a call that names it
    and hands over a ``register_buffer`` (``self._register_temp_attribute("x",
    None, lambda m, n, v: m.register_buffer(n, v))``); empty when none does."""
    if func.owner is None:
        return ""
    name = member.removeprefix("self.")
    quoted = (f'"{name}"', f"'{name}'")
    for methods in func.owner.methods.values():
        for method in methods:
            for call in method.calls:
                if any(q in call.arglist for q in quoted) and (
                        call.callee.endswith("register_buffer") or "register_buffer" in call.arglist):
                    return f"{call.callee} in {method.qualname}"
    return ""


def weight_member(func: Func, member: str) -> str:
    """Why ``member`` (``self.x``) of ``func``'s class is a weight, a
    parameter or registered buffer whose storage lives with its object:
    the class registers it (``register_buffer``/``register_parameter``
    naming it) or binds it to a ``torch.nn.Parameter`` in some method;
    empty when neither shows (a plain member, whatever its name)."""
    if func.owner is None:
        return ""
    registration = registration_of_member(func, member)
    if registration:
        return f"registered by {registration}"
    quoted = (f'"{member.removeprefix("self.")}"', f"'{member.removeprefix('self.')}'")
    for methods in func.owner.methods.values():
        for method in methods:
            for call in method.calls:
                if call.callee.endswith("register_parameter") and call.arglist.lstrip().startswith(quoted):
                    return f"registered by {call.callee} in {method.qualname}"
            if any("Parameter(" in a.value or a.value.endswith("Parameter") for a in method.assigns
                   if member in a.targets):
                return f"an nn.Parameter ({method.qualname})"
            table = method.table
            if table is not None and any(table.targets[i] == member and table.callees[i].endswith("Parameter")
                                         for i in method.call_ix):
                return f"an nn.Parameter ({method.qualname})"
    return ""


# `self.x.data`: the storage of the object's own member `self.x` replaced
OWN_DATA = re.compile(r"(self\.[A-Za-z_]\w*)\.data")


def data_store_of_local(func: Func, local: str, line: int, storage: re.Pattern[str]) -> str:
    """Round 28: the weight storage a local bound at ``line`` becomes,
    whole (``t = w.to(d)`` ... ``self.w.data = t``, ``p.data = t``), before
    anything rebinds the local to another value (``w.data += t`` adds it
    in place: not a store of it); ``self.x.data`` counts
    only where the class makes ``self.x`` a parameter or buffer, any other
    target where ``storage`` (``lifetimes``' weight-storage pattern) says so."""
    word = re.compile(rf"\b{re.escape(local)}\b")
    # every later binding, by assignment or by a call's value (`t = x.clone()`)
    later = sorted([(a.line, a.targets if a.op == "=" else (), a.value) for a in func.assigns if a.line > line]
                   + [(c.span.line, (c.target.strip(),), c.callee) for c in func.calls
                      if c.target and c.span.line > line], key=lambda b: b[0])
    for _, targets, value in later:
        if value.strip() == local:
            for t in targets:
                own = OWN_DATA.fullmatch(t)
                if (own is None and storage.fullmatch(t)) or (own is not None and weight_member(func, own.group(1))):
                    return t
        if local in targets and word.search(value) is None:
            return ""  # rebound to something else first
    return ""


def keyed_cache(site: Site, func: Func) -> tuple[str, str] | None:
    """The dict on the object or its class (``self.x``, ``cls.x``) the site
    is stored in under a key (``cls.x[device] = t.to(device)``), and the
    test around it that the key is missing (``if device not in cls.x:``; a
    guard clause ``if device in self.x: return`` before it), or
    a local looked up there first (``ws = self.x.get(k)``) that the test finds
    missing (``if ws is None:`` ... ``self.x[k] = ws``)."""
    local = (site.target or "").strip() or _statement_local(site, func)
    keyed = _KEYED.fullmatch(local)
    kept = site.kept if _KEYED.fullmatch(site.kept) or not local.isidentifier() else _stored_in(func, local, site)
    m = keyed or (_KEYED.fullmatch(kept) if local.isidentifier() else None)
    if m is None:
        return None
    owner, key = m.groups()
    k, o = re.escape(key.strip()), re.escape(owner)
    # `k not in self.x`; round 26: `self.x.get(k) is None`, `self.x[k].numel() < n` (missing, too small)
    missing = re.compile(rf"{k}\s+not\s+in\s+{o}\b|\b{o}\.get\(\s*{k}\s*(?:,\s*None\s*)?\)\s+is\s+None\b"
                         rf"|\b{o}\[\s*{k}\s*\](?:\.\w+|\(\))*\s*<(?!<)")
    present = re.compile(r"^\(?\s*" + k + r"\s+in\s+" + o + r"\s*\)?$")
    looked_up = m is not keyed and any((c.target or "").strip() == local and c.callee == f"{owner}.get"
                                       and c.span.line < site.span.line for c in func.calls)
    found = (f"{local} is not None", local) if looked_up else ()
    for block in func.blocks:
        if block.kind in ("if", "elif") and block.span.contains_line(site.span.line) and (
                missing.search(block.test) or (m is not keyed and block.test.strip() in (f"{local} is None",
                                                                                          f"not {local}"))):
            return owner, block.test
        if block.kind == "if" and block.exits and block.span.end_line < site.span.line and (
                present.match(" ".join(block.test.split()))  # `if k in self.x: return` before it
                or block.test.strip() in found):  # `st = self.x.get(k)`; `if st is not None: return st`
            return owner, f"not ({block.test.strip()})"
    return None


def _statement_local(site: Site, func: Func) -> str:
    """Round 26: the local the site's statement binds when the site sits
    inside the value (``st = dict(buf=torch.empty(n), ...)``, ``st = {...}``);
    "" when none."""
    line = site.stmt_line or site.span.line
    for call in func.calls:
        target = (call.target or "").strip()
        if target.isidentifier() and call.span != site.span and call.span.contains(site.span):
            return target
    for a in func.assigns:
        if a.line == line and a.op == "=" and len(a.targets) == 1 and a.targets[0].strip().isidentifier() \
                and a.value.lstrip()[:1] in ("{", "[", "("):
            return a.targets[0].strip()
    return ""


def _stored_in(func: Func, local: str, site: Site) -> str:
    """The entry of a container on the object or its class the function
    stores ``local`` in after the site (``self.x[k] = st``); "" when none."""
    for a in func.assigns:
        if a.line > site.span.line and a.op == "=" and a.value.strip() == local:
            for t in a.targets:
                if _KEYED.fullmatch(t.strip()):
                    return t.strip()
    return ""


def member_of(site: Site, func: Func) -> str | None:
    """The ``self.x`` the site's memory is stored in: where it is kept, its
    target, or the target of its statement (a list of buffers)."""
    for place in (site.kept, site.target or ""):
        if place.startswith("self.") and "[" not in place:
            return place
    for assign in func.assigns:
        if assign.line == site.stmt_line and len(assign.targets) == 1 and assign.targets[0].startswith("self."):
            return assign.targets[0] if "[" not in assign.targets[0] else None
    for call in func.calls:  # added to a member list: `self.kv_cache.append((torch.zeros(n), ...))`
        m = _ADD.fullmatch(call.callee)
        if m is not None and call.span != site.span and call.span.contains(site.span):
            return m.group(1)
    return None


def _members(func: Func) -> set[str]:
    """The ``self.x`` members the function stores buffers in (a test on one
    of them decides whether the cache is rebuilt: `self._freqs` for
    `self._freqs_state` built beside it)."""
    out = set()
    for site in func.sites:
        member = member_of(site, func)
        if member is not None:
            out.add(member)
    return out


def _cache_test(site: Site, func: Func, members: set[str]) -> str:
    """The test on the object's state that decides whether the site runs:
    a miss (``self.x is None``, ``not hasattr(self, "x")``, ``self.x.device
    != device``) around it, or a hit (``self.x is not None and ...``,
    ``channel == self.channel``) whose ``else`` holds it or whose body
    returns before it (a guard clause)."""
    line = site.span.line
    tests: dict[object, str] = {}
    for b in func.blocks:
        if b.kind in ("if", "elif") and b.stmt is not None:
            tests[b.stmt] = f"{tests[b.stmt]} / {b.test}" if b.stmt in tests else b.test
    for block in func.blocks:
        if block.kind not in _IF_KINDS:
            continue
        if block.span.contains_line(line):
            test = tests.get(block.stmt, "") if block.kind == "else" else block.test
            if (_hit(test, members) if block.kind == "else" else _miss(test, members)):
                return test
        elif block.exits and block.kind == "if" and block.span.end_line < line and _hit(block.test, members):
            return block.test
    return ""


_MEMBER = re.compile(r"\bself\.([A-Za-z_]\w*)")


def _phase_setup(site: Site, func: Func, member: str) -> str:
    """The branch test under which the function sets the member up (``if
    do_prefill: self.temp = torch.empty(...)``) when the branch (an ``if``, not an ``elif``)
    neither returns nor has an
    ``else``, its test does not name the member (``if self.x is not None:
    self.x = self.x.to(d)`` is a move per call) and the function reads the
    member after the branch: the calls that skip it reuse the kept buffer."""
    line, name = site.span.line, member.removeprefix("self.")
    inner = [b for b in func.blocks if b.kind in ("if", "elif") and b.span.contains_line(line)]
    if not inner:
        return ""
    branch = min(inner, key=lambda b: b.span.end_line - b.span.line)
    siblings = [b for b in func.blocks if b.stmt is not None and b.stmt == branch.stmt and b is not branch]
    if branch.kind != "if" or branch.exits or any(b.kind == "else" for b in siblings) \
            or any(m.group(1) == name for m in _MEMBER.finditer(branch.test)):
        return ""  # an `else` may store it too; a test on the member itself is _cache_test's
    after = max(b.span.end_line for b in [branch, *siblings])
    texts = [(c.span.line, f"{c.callee}({c.arglist})") for c in func.calls]
    texts += [(a.line, a.value) for a in func.assigns] + [(r.line, r.value) for r in func.returns]
    for at, text in texts:
        if at > after and any(m.group(1) == name for m in _MEMBER.finditer(text)):
            return branch.test
    return ""


_SIZE = r"(?:\blen\(\s*)?"  # `len(self.x) < n`: too small, grown on demand


def _miss(test: str, members: set[str]) -> bool:
    """A test that holds when the cached member is missing, stale, empty
    (``self.x.numel() == 0``, ``not self.x``) or too small (``n >
    len(self.x)``, ``self.x.numel() < n``: grown on demand)."""
    for member, name in _names(members):
        if member in test and _miss_pattern(name).search(test):  # every alternative spells the member
            return True
    return False


def _hit(test: str, members: set[str]) -> bool:
    """A test that holds when the cached member is there and fresh: ``self.x
    is not None``, ``self.x.dtype == ...``, ``hasattr(self, "x")``, or the
    member alone; every part of it (no ``or``)."""
    text = " ".join(test.split())
    if text.startswith("not ") or " or " in text:
        return False
    for member, name in _names(members):
        if member in text and _hit_pattern(name).search(text):  # every alternative spells the member
            return True
    return False


@functools.lru_cache(maxsize=4096)
def _miss_pattern(name: str) -> re.Pattern[str]:
    """`_miss`'s test for one (escaped) member name, compiled once."""
    return re.compile(rf"""\bself\.{name}\s+is\s+None\b|getattr\(\s*self\s*,\s*["']{name}["'][^)]*\)\s+is\s+None\b"""
                      rf"""|\bnot\s+hasattr\(\s*self\s*,\s*["']{name}["']"""
                      rf"|\bself\.{name}(?:\.\w+|\[[^\]]*\])*\s*!=|!=\s*self\.{name}\b"
                      rf"|{_SIZE}self\.{name}(?:\.\w+|\(\)|\[[^\]]*\])*\)?\s*<(?!<)|>\s*{_SIZE}self\.{name}\b"
                      # empty: `self.x.numel() == 0`, `len(self.x) == 0`, `not self.x`
                      rf"|{_SIZE}self\.{name}(?:\.\w+|\(\))*\)?\s*==\s*0\b|\bnot\s+self\.{name}\b(?![.\[(])")


@functools.lru_cache(maxsize=4096)
def _hit_pattern(name: str) -> re.Pattern[str]:
    """`_hit`'s test for one (escaped) member name, compiled once."""
    return re.compile(rf"""\bself\.{name}\s+is\s+not\s+None\b|\bself\.{name}(?:\.\w+|\[[^\]]*\])*\s*=="""
                      rf"""|==\s*self\.{name}\b|\bhasattr\(\s*self\s*,\s*["']{name}["']|^\(?self\.{name}\)?$""")


def _names(members: set[str]) -> list[tuple[str, str]]:
    """Each member's name after ``self.``, as written and escaped."""
    return [(m[len("self."):], re.escape(m[len("self."):])) for m in sorted(members)]
def _short(test: str) -> str:
    text = " ".join(test.split())
    return text if len(text) <= 60 else text[:57] + "..."
