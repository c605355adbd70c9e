"""Stage 5, classify: give each Site a tier and the reason for it. Pure.

Order of authority: an inline ``alloc-audit: tier=T<n> reason`` annotation on
the site's statement (or the comment lines right above it), then the ordered
tier patterns (the project's ``class-tiers`` and ``tiers`` first, then
``rules/tiers.toml``). A site no pattern matches is ``unknown``, with a reason
that says so: tiers are never guessed silently.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..catalog import TierPattern
from ..globs import matcher, test_path
from ..model import BENCHMARK, Annotation, FileFacts, Scope, Site, SiteKind, Tier
from .default_device import MODEL_BUILD as _MODEL_BUILD
from .extract.annotations import annotation_applies
from .private_closures import speaking_scope
from .roles import conventional_role


@dataclass(frozen=True)
class SiteContext:
    """What tier patterns can ask about a site's surroundings."""

    role: str
    functions: tuple[str, ...]  # enclosing function names, innermost first, lambdas skipped
    class_name: str
    function: str  # the innermost function name, or the scope for module/class level
    params: tuple[str, ...] = ()  # the parameters of the site's own scope


def scope_context(scope: str, scopes: Mapping[str, Scope]) -> SiteContext:
    """Role, enclosing functions and class of a qualified scope in one file."""
    own = scopes.get(scope)
    if own is None:
        return SiteContext(role="module", functions=(), class_name="", function=scope)
    sep = "::" if "::" in scope else "."
    parts = scope.split(sep)
    functions: list[str] = []
    class_name = ""
    for i in range(len(parts), 0, -1):
        found = scopes.get(sep.join(parts[:i]))
        if found is None:
            continue
        if found.kind == "function":
            functions.append(found.name)
        elif found.kind == "class" and not class_name:
            class_name = found.name
    if not class_name and own.owner:
        class_name = own.owner.split(sep)[-1]
    return SiteContext(
        role=own.role,
        functions=tuple(functions),
        class_name=class_name,
        function=functions[0] if functions else own.name,
        params=own.params,
    )


def annotation_for(site: Site, annotations: Sequence[Annotation], kind: str) -> Annotation | None:
    """The annotation of ``kind`` that applies to ``site`` (see
    ``annotation_applies``)."""
    if not annotations:
        return None
    for ann in annotations:
        if ann.kind == kind and annotation_applies(ann, site.span.end_line, site.stmt_line):
            return ann
    return None


class TierMatcher:
    """The ordered tier patterns, compiled, with a memo: many sites share
    every value a pattern looks at, so each combination is matched once. The
    memo key holds only the criteria some pattern uses (the shipped patterns
    never ask for the scope or the api, so those do not split the memo)."""

    def __init__(self, patterns: Sequence[TierPattern]) -> None:
        self.patterns = list(patterns)
        self.tests = [tuple((key, matcher(globs)) for key, globs in p.criteria) for p in self.patterns]
        self.used = tuple(sorted({key for p in self.patterns for key, _globs in p.criteria}))
        # patterns that decide T1-T3 from a name (function, class, scope,
        # path globs) and nothing about the buffer itself: they classify the
        # buffers a function keeps, never its temporaries or test code
        # (and patterns that decide them from the role alone, `constructor`:
        # a constructor's temporaries die when it returns)
        # (a name that speaks only for where a buffer is kept, `*kv_cache*`
        # with a `target`, is a name pattern too)
        about_buffer = [any(k in _BUFFER_KEYS for k, _g in p.criteria) for p in self.patterns]
        only_place = [{k for k, _g in p.criteria if k in _BUFFER_KEYS} == {"target"} for p in self.patterns]
        self.by_name = [p.tier in _NAMED_TIERS and any(k in _NAME_KEYS for k, _g in p.criteria) and (not b or o)
                        for p, b, o in zip(self.patterns, about_buffer, only_place)]
        self.by_role = [p.tier in _NAMED_TIERS and not b and any(k == "role" for k, _g in p.criteria)
                        for p, b in zip(self.patterns, about_buffer)]
        self._memo: dict[tuple[object, ...], int] = {}
        # where each pattern stands, by identity: ``list.index`` compares the
        # patterns field by field (dataclass equality), per site
        self._position: dict[int, int] = {}
        for i, p in enumerate(self.patterns):
            self._position.setdefault(id(p), i)
        # every criterion of every pattern is one bit; per criterion key, its criteria's bits and tests; per
        # pattern, the bits it needs. A value's bits (the criteria of its key it passes) are found once: the
        # same function, class, path and api recur across thousands of sites (``_match``)
        self._criteria: dict[str, list[tuple[int, Callable[[str], bool]]]] = {}
        self._need: list[int] = []
        bit = 0
        for tests in self.tests:
            need = 0
            for key, test in tests:
                self._criteria.setdefault(key, []).append((1 << bit, test))
                need |= 1 << bit
                bit += 1
            self._need.append(need)
        self._bits: dict[tuple[str, str], int] = {}

    def first(self, site: Site, ctx: SiteContext, names: bool = True, roles: bool = True) -> TierPattern | None:
        values = {
            "kind": (site.kind.value,),
            "function": ctx.functions,
            "class": (ctx.class_name,) if ctx.class_name else (),
            "scope": (site.scope,),
            "path": (site.path,),
            "role": (ctx.role,),
            "api": (site.api,),
            "wrapper": (site.wrapper,) if site.wrapper else (),
            # a local that ends up on an object counts as kept there
            "target": tuple(t for t in (site.target, _kept_place(site.kept)) if t),
            "kept": (site.kept,) if site.kept else (),
        }
        key = (*(values[k] for k in self.used), names, roles)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._match(values, names, roles)
        return self.patterns[found] if found >= 0 else None

    def named(self, pattern: TierPattern) -> bool:
        return self.by_name[self._index(pattern)]

    def role_only(self, pattern: TierPattern) -> bool:
        return self.by_role[self._index(pattern)]

    def _index(self, pattern: TierPattern) -> int:
        """``pattern``'s place (one ``first`` returned: found by identity).
        An equal pattern elsewhere in the list has the same tier and
        criteria, so ``by_name`` and ``by_role`` say the same of it."""
        i = self._position.get(id(pattern))
        return i if i is not None and self.patterns[i] is pattern else self.patterns.index(pattern)

    def _match(self, values: Mapping[str, tuple[str, ...]], names: bool = True, roles: bool = True) -> int:
        """The first pattern (not skipped by ``names``/``roles``) each of whose
        criteria some value of its key passes, or -1. The tests are pure, so
        asking each (key, value) once gives the answers of asking per pattern
        (tests/test_tier_matcher.py compares with that walk)."""
        passed = 0
        bits = self._bits
        for key, criteria in self._criteria.items():
            for value in values[key]:
                found = bits.get((key, value))
                if found is None:
                    if len(bits) > 500_000:  # a bound, for very long-lived processes
                        bits.clear()
                    found = 0
                    for bit, test in criteria:
                        if test(value):
                            found |= bit
                    bits[(key, value)] = found
                passed |= found
        for i, need in enumerate(self._need):
            if (not names and self.by_name[i]) or (not roles and self.by_role[i]):
                continue
            if passed & need == need:
                return i
        return -1


@lru_cache(maxsize=8)
def tier_matcher(patterns: tuple[TierPattern, ...]) -> TierMatcher:
    return TierMatcher(patterns)


def classify_sites(sites: Iterable[Site], files: Mapping[str, FileFacts],
                   patterns: Sequence[TierPattern]) -> tuple[Site, ...]:
    compiled = tier_matcher(tuple(patterns))
    scope_maps: dict[str, dict[str, Scope]] = {}
    out = []
    for site in sites:
        facts = files.get(site.path)
        scopes = scope_maps.get(site.path)
        if scopes is None:
            scopes = scope_maps[site.path] = {s.qualname: s for s in reversed(facts.scopes)} if facts else {}
        annotations = facts.annotations if facts else ()
        ctx = scope_context(site.scope, scopes)
        speaking = speaking_scope(site.scope, facts, scopes) if facts and len(ctx.functions) > 1 else site.scope
        if speaking == site.scope:
            out.append(classify_site(site, ctx, annotations, compiled))
            continue
        own = classify_site(site, ctx, annotations, compiled)
        outer = classify_site(site, dataclasses.replace(scope_context(speaking, scopes), params=ctx.params),
                              annotations, compiled)
        if outer.tier is own.tier or outer.tier_reason.startswith("annotated"):
            out.append(own)
            continue
        out.append(dataclasses.replace(outer, tier_reason=(
            f"{outer.tier_reason}; {site.scope} is a closure only {speaking} calls: it runs when that runs, "
            f"so {ctx.function}'s name does not decide (was: {own.tier_reason})")))
    return tuple(out)


_NAMED_TIERS = frozenset({"T1", "T2", "T3"})
_NAME_KEYS = frozenset({"function", "class", "scope", "path"})
_BUFFER_KEYS = frozenset({"kind", "wrapper", "target", "api", "kept"})


def _kept_place(kept: str) -> str:
    """The attribute a local ends up in (`self._storage`), else ""."""
    return kept if kept and kept not in ("local", "return", "static") and not kept.startswith("handed:") else ""


def _kept_on_object(target: str | None) -> bool:
    """`self.x`, `layer.x`, `self.x[i]`: an attribute of an object, not a local."""
    return bool(target) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\[[^\]]*\])?", target or "") is not None


def _benchmark_input(site: Site) -> bool:
    """A buffer of benchmark code that is not kept on an object (a local or
    a returned value): the inputs of one case."""
    return conventional_role(site.path) == BENCHMARK and not _kept_on_object(site.target) \
        and not _kept_place(site.kept)


def _held_by_caller(site: Site, ctx: SiteContext) -> str:
    """The parameter whose container (`d[k]`, `d[i][k]`) receives a pinned
    host buffer, else ""."""
    if site.kind is not SiteKind.PINNED_HOST or not site.target or ctx.role in ("module", "class"):
        return ""
    m = re.fullmatch(r"([A-Za-z_]\w*)(?:\[[^\]]+\])+", site.target.strip())
    return m.group(1) if m is not None and m.group(1) in ctx.params and m.group(1) != "self" else ""


def classify_site(site: Site, ctx: SiteContext, annotations: Sequence[Annotation], compiled: TierMatcher) -> Site:
    ann = annotation_for(site, annotations, "tier")
    if ann is not None and not ann.problem and ann.tier:
        why = ann.reason or "no reason given"
        return dataclasses.replace(site, tier=Tier(ann.tier), tier_reason=f"annotated at line {ann.line}: {why}")
    if site.recovered:
        return dataclasses.replace(site, tier=Tier.UNKNOWN, tier_reason=(
            "inside code the parser could not read (a syntax error around it): its enclosing scope, "
            "and so its lifetime, cannot be told; fix the syntax or annotate a tier"))
    if site.device_context and _MODEL_BUILD in site.device_context and site.wrapper is None \
            and _kept_on_object(site.target):
        # kept on a module while the model is built (`self.bias = ...` in a
        # constructor, `layer.k_scale = ...` in a helper it calls): it lives
        # as long as the model, whatever the function is called
        return dataclasses.replace(site, tier=Tier.T1, tier_reason=(
            f"model-resident: kept in {site.target} by {site.scope}; no device given, {site.device_context}"))
    held = _held_by_caller(site, ctx)
    if held:
        # `pinned[k] = torch.empty_like(v, pin_memory=True)` into a container
        # the caller hands in: it outlives the call, kept by whoever holds it
        return dataclasses.replace(site, tier=Tier.T5B, tier_reason=(
            f"persistent pinned host buffer kept in the container {held} that the caller hands to {site.scope}"))
    pattern = compiled.first(site, ctx)
    note = ""
    # at module level a local is a global: only an allocation bound to no name (a chain's dropped start) is not
    temporary = site.kept == "local" and (ctx.role not in ("module", "class") or site.target is None)
    if pattern is not None and temporary and (compiled.named(pattern) or compiled.role_only(pattern)):
        # the name (or the constructor) speaks for what the function keeps,
        # not for a buffer it drops
        note = f"; a temporary (not kept, returned or handed on): the pattern for {pattern.tier} does not apply"
        pattern = compiled.first(site, ctx, names=False, roles=False)
        if pattern is None:
            dies = "its statement ends (bound to no name)" if site.scope == "<module>" else "the call returns"
            return dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                f"temporary in {site.scope}: not kept, returned or handed on, it dies when {dies}"
                + (f"; no device given, {site.device_context}" if site.device_context else "")))
    elif pattern is not None and compiled.named(pattern) and (
            test_path(site.path) or _benchmark_input(site)):
        # test and benchmark code is never T1-T3 by a name: a benchmark's
        # `setup_*` builds the inputs of one case (the harness calls it per
        # case and drops what it returns); one it keeps on an object keeps
        # its pattern
        note = f"; test or benchmark code: the name pattern for {pattern.tier} does not apply"
        pattern = compiled.first(site, ctx, names=False)
    if pattern is not None:
        reason = pattern.reason.format(
            scope=site.scope, function=ctx.function, **{"class": ctx.class_name or "?"},
            path=site.path, api=site.api, target=site.target or "?",
            kept=_kept_place(site.kept) or site.target or "?",
        )
        reason += note
        if site.device_context:
            reason = f"{reason}; no device given, {site.device_context}"
        return dataclasses.replace(site, tier=Tier(pattern.tier), tier_reason=reason)
    return dataclasses.replace(site, tier=Tier.UNKNOWN,
                               tier_reason=f"no tier pattern matches {ctx.role} {site.scope}")

