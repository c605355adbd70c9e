"""Stage 5, after ``reset_members``: members a per-call method makes anew on
every call live one call (issue 11, round 33; docs/tiers.md §1).

Input: the sites with their tiers so far. Output: the same sites, some of
them re-tiered.

A method ``M`` that a per-call method ``G`` (a per-step name of
rules/tiers.toml ``[callers]``: ``generate``, ``__call__``, ``forward``)
calls as ``self.M(...)`` on every call (no ``if``, ``else`` nor ``except``
of ``G`` around the call) rebinds each ``self.x`` it stores outside a guard
to a new buffer or object at each call of ``G``; the last call's one is
dropped. What it stores there lives one call, however long the object
holding the member lives: T4, a pinned buffer T5a (staging re-made per
call), not the T2/T3/T5b a constructor-like name or a slab gave it. ``G``
may be a method of ``M``'s class, of a base (``LLM.generate`` calling the
``init_kv_cache`` a model subclass defines) or of a subclass.

A store is guarded when an ``if``/``elif``/``else`` around it, or a guard
clause before it that leaves the method, tests anything but a setting: a
bare flag (``if self.offload:``) or a comparison with a literal
(``if self.attention_type == "full":``) is a setting, read the same at each
call; a test naming the member (``if self.cache is None:``), a size
(``if n > self.capacity:``) or ``None`` is a guard: the member is kept
across calls. Stores in a loop of ``M`` are rebuilt as well.

Transitively: a project class every construction of which is such an
unguarded member store of such a method ``M`` (no subclass, no ``cls(...)``
factory) makes an object per call, and what its methods keep on ``self``
(constructor, the set-up helpers it calls, methods re-making a buffer) is
per call too: T4, pinned T5a.

True: ``generate`` runs ``self.init_kv_cache(b, n)`` first thing, and
``init_kv_cache`` does ``self.kv_cache = StaticCache(b, n)``: the
``StaticCache`` and its ``torch.zeros`` slabs are T4. False: the same call
under ``if self.kv_cache is None:`` in ``generate``, or the store under
``if n > self.capacity:`` in ``init_kv_cache``, or ``init_kv_cache`` called
only from ``__init__``: kept, the tier stands; ``forward``'s own
``self.x = ...`` is left to the other passes (``G`` is not ``M``); a class
also built in a constructor keeps its constructor's tier. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Block, Call, Language, Site, SiteKind, Tier
from .built_per_call import direct_callers
from .built_per_pass import class_factories
from .index import ClassInfo, Func, ProjectIndex
from .names import has_word
from .repinned_members import flag_test
from .retier import Decision, retier

_TIERS = (Tier.T2, Tier.T3, Tier.T5B)
_SELF_CALL = re.compile(r"self\.([A-Za-z_]\w*)")
_MEMBER = re.compile(r"self\.([A-Za-z_]\w*)")
# blocks whose body runs on some calls only: a call or a store there is not made every time
_SOMETIMES = frozenset({"if", "elif", "else", "except", "finally", "try-else", "loop-else"})
_LITERAL = r"""(?:[-+]?\d[\w.]*|'[^']*'|"[^"]*"|True|False)"""
_OPERAND = r"[A-Za-z_][\w.]*(?:\[(?:'[^']*'|\"[^\"]*\"|\w+)\])*"
# a setting read the same at each call: `self.kind == "static"`, `cfg["gpu_only"] is True`, `mode in ("a", "b")`
_SETTING = re.compile(rf"\s*(?:not\s+)?{_OPERAND}\s*(?:==|!=|is\s+not|is)\s*{_LITERAL}\s*"
                      rf"|\s*{_OPERAND}\s*(?:not\s+)?in\s*[(\[]\s*{_LITERAL}(?:\s*,\s*{_LITERAL})*\s*,?\s*[)\]]\s*")
_JOIN = re.compile(r"\s+(?:and|or)\s+")
_MEMBER_WORD = re.compile(r"\bself\.([A-Za-z_]\w*)")


def rebuilt_members(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.per_step:
        return list(sites)
    step = matcher(globs.per_step)
    load = matcher(globs.load) if globs.load else (lambda name: False)
    rebuilt = _rebuilt_methods(index, step, load)
    if not rebuilt:
        return list(sites)
    per_call = _per_call_classes(index, rebuilt)

    def eligible(site: Site) -> bool:
        return site.language is Language.PYTHON and site.tier in _TIERS and \
            _MEMBER.match(site.target or "") is not None

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None:
            return None
        pinned = site.kind is SiteKind.PINNED_HOST
        tier = Tier.T5A if pinned else Tier.T4
        what = "pinned staging re-made per call" if pinned else "per call"
        member = site.target or ""
        line = site.stmt_line or site.span.line
        if func.id in rebuilt and _unguarded(func, line, member):
            caller, call = rebuilt[func.id]
            return tier, (f"{what}: {caller.qualname} calls {func.name} on every call (line {call.span.line}), "
                          f"which rebinds {member} to a new one; the last call's is dropped; "
                          f"was: {site.tier_reason}")
        owner = func.owner
        if owner is None or func.scope is None:
            return None
        if owner.key in per_call:
            return tier, (f"{what}: {owner.name} is built only into members that a per-call method makes "
                          f"anew on every call ({per_call[owner.key]}), so what it keeps lives one call; "
                          f"was: {site.tier_reason}")
        return None

    return retier(sites, eligible, decide)


def _rebuilt_methods(index: ProjectIndex, step: Callable[[str], bool],
                     load: Callable[[str], bool]) -> dict[str, tuple[Func, Call]]:
    """Method id -> (the per-call method that calls it on every call, the call)."""
    out: dict[str, tuple[Func, Call]] = {}
    for caller in index.functions():
        scope = caller.scope
        if caller.language is not Language.PYTHON or scope is None or scope.role != "method" \
                or caller.owner is None or not step(caller.name) or load(caller.name):
            continue
        for call in caller.calls:
            found = _SELF_CALL.fullmatch(call.callee)
            if found is None or _sometimes(caller.blocks, call.span.line):
                continue
            for method in _methods(index, caller, call, found.group(1)):
                if method is caller or method.id in out or method.scope is None \
                        or method.scope.role != "method" or step(method.name) or load(method.name):
                    continue
                out[method.id] = (caller, call)
    return out


def _methods(index: ProjectIndex, caller: Func, call: Call, name: str) -> list[Func]:
    """What ``self.name(...)`` in ``caller`` runs: the resolved method, and
    the overrides in subclasses of ``caller``'s class (its object may be one)."""
    found = [f for f in index.resolve(caller, call) if f.owner is not None]
    owner = caller.owner
    if owner is not None:
        for sub in index.subclass_names(owner.name):
            for cls in index.classes_named(sub):
                if cls.language is Language.PYTHON:
                    found.extend(m for m in cls.methods.get(name, []) if m not in found)
    return found


def _sometimes(blocks: Sequence[Block], line: int) -> bool:
    return any(b.kind in _SOMETIMES and b.span.line <= line <= b.span.end_line for b in blocks)


def _unguarded(func: Func, line: int, member: str) -> bool:
    """The store at ``line`` runs at each call of ``func``, whatever the
    member holds: every test around it, and every earlier guard clause, is
    a setting (see the module docstring), a loop's too; no ``except``."""
    name = _MEMBER.match(member)
    word = name.group(1) if name is not None else member
    for block in func.blocks:
        around = block.span.line <= line <= block.span.end_line
        if around and block.kind in ("except", "finally", "try-else", "loop-else"):
            return False
        if around and block.kind == "else":
            siblings = [b for b in func.blocks if b.stmt == block.stmt and b.kind in ("if", "elif")]
            if not all(_setting(b.test, word, func) for b in siblings):
                return False
        elif around and block.kind in ("if", "elif", "loop") and block.test and not _setting(block.test, word, func) \
                and not (block.kind == "loop" and not has_word(block.test, word)):
            return False
        if not around and block.exits and block.span.end_line < line and block.kind in ("if", "elif") \
                and not _setting(block.test, word, func):
            return False
    return True


def _setting(test: str, member: str, func: Func | None = None) -> bool:
    """A test read the same at each call: a bare flag or comparisons with
    literals joined by and/or, not naming the member, no ``None``, no
    attribute of the object that a method of its class other than a
    constructor sets (``if not self._initialized:``, set in the branch)."""
    if not test or has_word(test, member) or has_word(test, "None"):
        return not test
    if func is not None and func.owner is not None and any(
            _set_outside_constructor(func.owner, name) for name in _MEMBER_WORD.findall(test)):
        return False
    text = test.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return all(flag_test(part) or _SETTING.fullmatch(part) is not None for part in _JOIN.split(text))


def _set_outside_constructor(owner: ClassInfo, name: str) -> bool:
    target = f"self.{name}"
    return any(f.scope is not None and f.scope.role != "constructor" and any(
        target in a.targets or any(t.strip().startswith(target + "[") for t in a.targets) for a in f.assigns)
        for methods in owner.methods.values() for f in methods)


def _per_call_classes(index: ProjectIndex, rebuilt: dict[str, tuple[Func, Call]]) -> dict[str, str]:
    """Class key -> the methods that build it, for the project classes every
    construction of which is an unguarded member store of a rebuilt method."""
    candidates: dict[str, ClassInfo] = {}
    for fid in rebuilt:
        method = index.funcs.get(fid)
        if method is None:
            continue
        for call in method.calls:
            cls = index.constructed_class(method, call)
            if cls is not None and cls.language is Language.PYTHON:
                candidates.setdefault(cls.key, cls)
    out: dict[str, str] = {}
    factories: dict[str, list[Func]] = {}
    for key, cls in sorted(candidates.items()):
        builders = _builders(index, cls, rebuilt, factories)
        if builders:
            out[key] = builders
    return out


def _builders(index: ProjectIndex, cls: ClassInfo, rebuilt: dict[str, tuple[Func, Call]],
              factories: dict[str, list[Func]]) -> str:
    ctors = index.constructors(cls)
    if not ctors or index.subclass_names(cls.name) or class_factories(index, ctors, factories):
        return ""
    builders = direct_callers(ctors, index)
    if not builders:
        return ""
    named = []
    for builder in builders:
        if builder.id not in rebuilt:
            return ""
        for call in builder.calls:
            if index.constructed_class(builder, call) is not cls:
                continue
            target = (call.target or "").strip()
            if _MEMBER.match(target) is None or not _unguarded(builder, call.span.line, target):
                return ""
        caller = rebuilt[builder.id][0]
        named.append(f"{builder.qualname} <- {caller.qualname}")
    return ", ".join(named[:3]) + (f", +{len(named) - 3} more" if len(named) > 3 else "")
