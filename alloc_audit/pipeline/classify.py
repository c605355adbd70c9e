"""Stage 5, classify: give each Site a tier and the reason for it. Pure.

Order of authority: an inline ``alloc-audit: tier=T<n> reason`` annotation on
the site's statement (or the comment lines right above it), then the ordered
tier patterns (the project's ``class-tiers`` and ``tiers`` first, then
``rules/tiers.toml``). A site no pattern matches is ``unknown``, with a reason
that says so: tiers are never guessed silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..catalog import TierPattern
from ..globs import matcher
from ..model import Annotation, FileFacts, Scope, Site, Tier
from .extract.annotations import annotation_applies


@dataclass(frozen=True)
class SiteContext:
    """What tier patterns can ask about a site's surroundings."""

    role: str
    functions: tuple[str, ...]  # enclosing function names, innermost first, lambdas skipped
    class_name: str
    function: str  # the innermost function name, or the scope for module/class level


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
        self._memo: dict[tuple[object, ...], int] = {}

    def first(self, site: Site, ctx: SiteContext) -> TierPattern | None:
        values = {
            "kind": (site.kind.value,),
            "function": ctx.functions,
            "class": (ctx.class_name,) if ctx.class_name else (),
            "scope": (site.scope,),
            "path": (site.path,),
            "role": (ctx.role,),
            "api": (site.api,),
            "wrapper": (site.wrapper,) if site.wrapper else (),
            "target": (site.target,) if site.target else (),
        }
        key = tuple(values[k] for k in self.used)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._match(values)
        return self.patterns[found] if found >= 0 else None

    def _match(self, values: Mapping[str, tuple[str, ...]]) -> int:
        for i, tests in enumerate(self.tests):
            for key, test in tests:
                for value in values[key]:
                    if test(value):
                        break
                else:
                    break  # this criterion failed: next pattern
            else:
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
        out.append(classify_site(site, scope_context(site.scope, scopes), annotations, compiled))
    return tuple(out)


def classify_site(site: Site, ctx: SiteContext, annotations: Sequence[Annotation], compiled: TierMatcher) -> Site:
    ann = annotation_for(site, annotations, "tier")
    if ann is not None and not ann.problem and ann.tier:
        why = ann.reason or "no reason given"
        return dataclasses.replace(site, tier=Tier(ann.tier), tier_reason=f"annotated at line {ann.line}: {why}")
    if site.recovered:
        return dataclasses.replace(site, tier=Tier.UNKNOWN, tier_reason=(
            "inside code the parser could not read (a syntax error around it): its enclosing scope, "
            "and so its lifetime, cannot be told; fix the syntax or annotate a tier"))
    pattern = compiled.first(site, ctx)
    if pattern is not None:
        reason = pattern.reason.format(
            scope=site.scope, function=ctx.function, **{"class": ctx.class_name or "?"},
            path=site.path, api=site.api, target=site.target or "?",
        )
        return dataclasses.replace(site, tier=Tier(pattern.tier), tier_reason=reason)
    return dataclasses.replace(site, tier=Tier.UNKNOWN,
                               tier_reason=f"no tier pattern matches {ctx.role} {site.scope}")
