"""What every rule module shares: the ``Rule`` record and the context a
rule's ``check`` receives. No base class: a rule is a function plus data."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..model import Finding, Language, Severity, Site
from ..pack import RulePack
from ..pipeline.index import ProjectIndex
from ..pipeline.roles import conventional_role
from ..report.sizes import estimate_bytes, human


def site_bytes(site: Site) -> tuple[int, str] | None:
    """A site's size in bytes when its arguments are literals, and that size
    for people (``16 B``); None when it is not known."""
    size = estimate_bytes(site, ())
    return (size, human(size)) if size else None


@dataclass(frozen=True)
class RuleContext:
    index: ProjectIndex
    pack: RulePack
    role_of: Callable[[str], str] = conventional_role  # a path's code role (pipeline/roles.py)
    bytes_of: Callable[[Site], tuple[int, str] | None] = site_bytes  # a site's size when its arguments say it


@dataclass(frozen=True)
class StartPoints:
    """Where a rule starts looking, as name globs: functions that call one of
    ``calls``, enter a ``with`` item matching ``contexts``, carry a decorator
    matching ``decorators``, are named like ``hooks``, or whose qualified name
    matches ``declared``. The on-demand expansion parses what these call."""

    calls: tuple[str, ...] = ()
    contexts: tuple[str, ...] = ()
    decorators: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    declared: tuple[str, ...] = ()


def no_start_points(pack: RulePack) -> StartPoints:
    return StartPoints()


@dataclass(frozen=True)
class Triggers:
    """What must be in a file's bytes for the rule to need it parsed (the
    pre-filter, ``pipeline/prefilter.py``): names that are called (their last
    component followed by ``(``) and names that are only written (decorators,
    attributes)."""

    called: tuple[str, ...] = ()
    named: tuple[str, ...] = ()


def no_triggers(pack: RulePack) -> Triggers:
    return Triggers()


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
    meta: bool = False  # about annotations: reported by pipeline/suppress.py, always on
    starts: Callable[[RulePack], StartPoints] = no_start_points  # where check() starts, from the pack
    triggers: Callable[[RulePack], Triggers] = no_triggers  # what a file must say to be parsed for it
