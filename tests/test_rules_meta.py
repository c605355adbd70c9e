"""The rule catalogue's own invariants (STYLE.md sections 3, 5 and 8)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from fixtures_harness import ANNOTATION, FIXTURES

import alloc_audit.rules as rules_pkg
from alloc_audit.model import Language
from alloc_audit.rules import ALL_RULES, known_rule_names

HEADINGS = ("What it flags", "Why it matters", "Example", "How to fix", "How to suppress",
            "Known false positives", "Known false negatives")
BANNED_PREFIXES = ("no-", "avoid-", "use-", "prefer-", "do-not-", "disallow-")
ALL = list(ALL_RULES)
HAZARDS = [r for r in ALL_RULES if not r.meta]  # the meta rules have no check and no fixtures of their own


def _annotations() -> list[tuple[str, str, str]]:
    """(language family, kind, rule) for every fixture annotation."""
    out = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.suffix not in (".py", ".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh"):
            continue
        family = "python" if path.suffix == ".py" else "native"
        for line in path.read_bytes().decode("utf-8", "replace").splitlines():
            m = ANNOTATION.match(line)
            if m and m.group(1) in ("expect", "ok", "todo-expect", "todo-ok"):
                out.append((family, m.group(1), m.group(2).split()[0]))
    return out


ANNOTATIONS = _annotations()


@pytest.mark.parametrize("rule", ALL, ids=[r.name for r in ALL])
def test_doc_has_every_heading(rule: object) -> None:
    doc = rule.doc  # type: ignore[attr-defined]
    missing = [h for h in HEADINGS if f"## {h}" not in doc]
    assert not missing, f"{rule.name} lacks {missing}"  # type: ignore[attr-defined]


@pytest.mark.parametrize("rule", ALL, ids=[r.name for r in ALL])
def test_name_is_kebab_case_and_names_the_pattern(rule: object) -> None:
    name = rule.name  # type: ignore[attr-defined]
    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", name)
    assert not name.startswith(BANNED_PREFIXES)


def test_every_rule_module_is_registered() -> None:
    registered = {r.name for r in ALL_RULES}
    for info in pkgutil.iter_modules(rules_pkg.__path__):
        module = importlib.import_module(f"alloc_audit.rules.{info.name}")
        rule = getattr(module, "RULE", None)
        if rule is not None:
            assert rule.name in registered, f"alloc_audit/rules/{info.name}.py is not in ALL_RULES"
            assert info.name == rule.name.replace("-", "_"), "module name must be the rule name with _"


def test_rule_names_are_unique() -> None:
    names = [r.name for r in ALL]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("rule", HAZARDS, ids=[r.name for r in HAZARDS])
def test_fixtures_cover_each_language(rule: object) -> None:
    name = rule.name  # type: ignore[attr-defined]
    families = {"python"} if Language.PYTHON in rule.languages else set()  # type: ignore[attr-defined]
    if rule.languages & {Language.CPP, Language.CUDA}:  # type: ignore[attr-defined]
        families.add("native")
    for family in sorted(families):
        expects = sum(1 for f, k, r in ANNOTATIONS if f == family and k == "expect" and r == name)
        oks = sum(1 for f, k, r in ANNOTATIONS if f == family and k == "ok" and r == name)
        assert expects >= 3, f"{name}: {expects} expect lines in {family} fixtures (need 3)"
        assert oks >= 3, f"{name}: {oks} ok lines in {family} fixtures (need 3)"


@pytest.mark.parametrize("rule", HAZARDS, ids=[r.name for r in HAZARDS])
def test_known_limits_are_pinned(rule: object) -> None:
    name = rule.name  # type: ignore[attr-defined]
    todo = {k for _f, k, r in ANNOTATIONS if r == name and k.startswith("todo")}
    assert todo == {"todo-expect", "todo-ok"}, f"{name}: pin a known false negative and a known false positive"


def test_every_annotation_names_a_known_rule() -> None:
    known = known_rule_names()
    unknown = sorted({r for _f, _k, r in ANNOTATIONS if r not in known})
    assert not unknown, f"fixtures name unknown rules: {unknown}"


# Where production code names a rule outside its module, on purpose.
NAMED_ELSEWHERE = {("per-call-alloc", "commands/audit.py")}  # audit's default when a site has no finding
# `join` (issue 13) confirms these rules' findings from what a recorded run did;
# the confirmations came from the join branch as one table in runtime/verdicts.py.
# Follow-up: a rule owns its runtime confirmation (like starts/triggers), then
# these entries go.
NAMED_ELSEWHERE |= {(name, "runtime/verdicts.py") for name in (
    "alloc-in-capture", "alloc-bypasses-plan", "snapshot-before-construction", "throwaway-graph-pool",
    "grow-on-demand", "per-call-alloc")}


def test_a_rule_lives_in_its_module_and_one_registry_line() -> None:
    """The recipe in docs/ARCHITECTURE.md: adding a rule is one module, one
    line in ALL_RULES, fixtures and docs. So no other production module names
    a rule (no table of rules to keep in sync), and the registry names each
    rule module exactly once."""
    package = Path(rules_pkg.__file__).parent.parent
    registry = (package / "rules" / "__init__.py").read_text(encoding="utf-8")
    for rule in HAZARDS:
        module = rule.name.replace("-", "_")
        assert registry.count(f"{module}.RULE") == 1, f"{rule.name}: one line in ALL_RULES"
        for path in sorted(package.rglob("*.py")):
            rel = path.relative_to(package).as_posix()
            if rel == f"rules/{module}.py" or (rule.name, rel) in NAMED_ELSEWHERE:
                continue
            assert f'"{rule.name}"' not in path.read_text(encoding="utf-8"), f"{rel} names {rule.name}"
