"""`alloc-audit rules list|explain`: the registry, with what the project's
configuration turns on and the severities it sets."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from .outcome import Text
from .project import load_project


def list_rules(config_path: Path | None) -> Text:
    """List every rule with its severity, whether it is on, and a summary.

    Example:

      alloc-audit rules list
    """
    from ..rules import ALL_RULES, enabled_rules

    try:
        config = load_project(None, config_path).config
        on = {r.name for r in enabled_rules(config)}
        severities = dict(config.severity)
    except UsageError:
        on, severities = {r.name for r in ALL_RULES if r.default_on}, {}
    width = max([len(r.name) for r in ALL_RULES] or [10])
    lines = []
    for rule in ALL_RULES:  # the meta rules are always on, at their own severity
        state = "on " if rule.meta or rule.name in on else "off"
        severity = rule.severity.value if rule.meta else severities.get(rule.name, rule.severity.value)
        lines.append(f"{rule.name:<{width}}  {severity:<7}  {state}  {rule.summary}\n")
    return Text("".join(lines))


def explain(name: str, color: bool = False, width: int | None = None) -> Text:
    """Print a rule's documentation: what it flags, why, an example, how to fix and suppress it.

    Example:

      alloc-audit rules explain snapshot-before-construction
    """
    from ..rules import ALL_RULES, rule_by_name

    rule = rule_by_name(name)
    if rule is None:
        import difflib

        names = [r.name for r in ALL_RULES]
        hint = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        if hint:
            raise UsageError(f"unknown rule '{name}'; did you mean '{hint[0]}'? (`alloc-audit rules list` lists them)")
        raise UsageError(f"unknown rule '{name}'; known rules: {', '.join(names)}")
    from ..report.terminal import render_rule_doc

    return Text(render_rule_doc(rule.name, rule.severity.value, rule.default_on, rule.doc, color, width))
