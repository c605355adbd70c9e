"""What every rule module shares: the ``Rule`` record and the context a
rule's ``check`` receives. No base class: a rule is a function plus data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..catalog import RulePack
from ..pipeline.index import ProjectIndex
from ..model import Finding, Language, Severity, Site


@dataclass(frozen=True)
class RuleContext:
    index: ProjectIndex
    pack: RulePack
    sites: tuple[Site, ...]  # classified, direct and derived


@dataclass(frozen=True)
class Rule:
    name: str
    severity: Severity
    summary: str
    doc: str
    check: Callable[[RuleContext], Iterable[Finding]]
    languages: frozenset[Language] = frozenset(Language)
    default_on: bool = True
    aliases: tuple[str, ...] = field(default_factory=tuple)
