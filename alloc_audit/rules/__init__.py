"""Stage 6, rules: ProjectIndex -> Findings. One module per rule; this file
lists them (the registry is this tuple, greppable, nothing registers itself).
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import Config
from ..globs import matcher
from ..model import Finding, Severity
from ..pack import RulePack
from ..pipeline.index import Func, ProjectIndex
from . import (
    alloc_bypasses_plan,
    alloc_in_capture,
    capture_without_rollback,
    grow_on_demand,
    live_free_memory_sizing,
    meta,
    per_call_alloc,
    retained_per_entry_alloc,
    snapshot_before_construction,
    throwaway_graph_pool,
)
from .base import Rule, RuleContext

ALL_RULES: tuple[Rule, ...] = (
    alloc_in_capture.RULE,
    alloc_bypasses_plan.RULE,
    snapshot_before_construction.RULE,
    retained_per_entry_alloc.RULE,
    throwaway_graph_pool.RULE,
    capture_without_rollback.RULE,
    live_free_memory_sizing.RULE,
    grow_on_demand.RULE,
    per_call_alloc.RULE,
    meta.UNUSED,
    meta.NO_REASON,
    meta.INVALID,
)


def rule_by_name(name: str) -> Rule | None:
    for rule in ALL_RULES:
        if rule.name == name or name in rule.aliases:
            return rule
    return None


def enabled_rules(config: Config) -> tuple[Rule, ...]:
    enable, disable = set(config.enable), set(config.disable)
    return tuple(r for r in ALL_RULES if r.meta or ((r.default_on or r.name in enable) and r.name not in disable))


def root_finder(pack: RulePack) -> Callable[[ProjectIndex], list[Func]]:
    """Functions where some rule starts looking (the on-demand expansion
    parses what they call): the union of every rule's ``starts`` (captures,
    memory readings, fresh pools, planned scratch, context managers and other
    per-entry hooks, declared captured functions and hot paths). Returns a
    function of the index, in its order."""
    points = [rule.starts(pack) for rule in ALL_RULES]
    calls = matcher(tuple(g for p in points for g in p.calls))
    contexts = matcher(tuple(g for p in points for g in p.contexts))
    decorators = matcher(tuple(g for p in points for g in p.decorators))
    hooks = matcher(tuple(g for p in points for g in p.hooks))
    declared = matcher(tuple(g for p in points for g in p.declared))

    memo: dict[str, bool] = {}  # a function's facts never change once indexed

    def otherwise_root(func: Func) -> bool:
        found = memo.get(func.id)
        if found is None:
            scope = func.scope
            found = memo[func.id] = any(contexts(i.callee) for w in func.withs for i in w.items) or (
                scope is not None and (
                    any(decorators(d) for d in scope.decorators)
                    or hooks(scope.name)
                    or declared(func.qualname.replace("::", "."))))
        return found

    def roots(index: ProjectIndex) -> list[Func]:
        calling = index.callers_matching(calls)
        return [f for f in index.funcs.values() if f.id in calling or otherwise_root(f)]

    return roots


def known_rule_names() -> dict[str, str]:
    """Every accepted rule name (aliases included) -> the current name."""
    names = {r.name: r.name for r in ALL_RULES if r.meta}
    for rule in ALL_RULES:
        names[rule.name] = rule.name
        for alias in rule.aliases:
            names[alias] = rule.name
    return names


def enabled_names(config: Config) -> frozenset[str]:
    return frozenset(r.name for r in enabled_rules(config))


def run_rules(index: ProjectIndex, pack: RulePack, config: Config) -> tuple[Finding, ...]:
    """Every enabled rule's findings, each with its file's code role, from
    the settled index alone (the run computes them while the tier passes
    run: ``pipeline/background``). A rule
    may set a finding's severity from its consequence (alloc-in-capture: a
    driver allocation is an error, an allocator tensor a warning); a
    severity the configuration names for the rule wins. Findings outside
    production code are `info` (DESIGN.md, "Code roles")."""
    import dataclasses

    from ..model import PRODUCTION
    from ..pipeline.roles import role_finder

    severities = dict(config.severity)
    role_of = role_finder(config.roles)
    ctx = RuleContext(index=index, pack=pack, role_of=role_of)
    out: list[Finding] = []
    for rule in enabled_rules(config):
        configured = severities.get(rule.name)
        for finding in rule.check(ctx):
            severity = Severity(configured) if configured else finding.severity
            role = role_of(finding.path)
            if role != PRODUCTION:
                severity = Severity.INFO
            if severity is not finding.severity or role != finding.role:
                finding = dataclasses.replace(finding, severity=severity, role=role)
            out.append(finding)
    return tuple(sorted(set(out), key=lambda f: f.sort_key))
