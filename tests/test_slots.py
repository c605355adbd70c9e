"""alloc_audit/slots: a call table's ``Call`` objects and a site's copy with
its code role, built by setting the slots (round 36), are the objects the
class's constructor and ``dataclasses.replace`` build (equal, hashed and
printed alike, of the same type), on every call and site of the Python
fixtures; a class whose construction does more is still constructed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fixtures_harness import extracted_facts

from alloc_audit.model import Call, FileFacts, Span
from alloc_audit.pipeline.roles import _with_role, conventional_role, with_roles
from alloc_audit.slots import builder, replacer

FIXTURES = Path(__file__).parent / "fixtures" / "python"


def _facts() -> list[FileFacts]:
    paths = tuple(sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.py")))
    return list(extracted_facts(FIXTURES, paths).values())


def _same(a: object, b: object) -> None:
    assert type(a) is type(b) and a == b and hash(a) == hash(b) and repr(a) == repr(b)


def test_table_calls_are_the_constructed_ones() -> None:
    facts = _facts()
    assert sum(len(f.calls) for f in facts) > 1000
    for f in facts:
        t = f.calls
        for i in range(len(t)):
            p = t.positions[4 * i:4 * i + 4]
            slow = Call(t.scopes[i], Span(*p), t.callees[i], t.arglists[i], t.targets[i])
            _same(t[i], slow)
            _same(t[i].span, slow.span)


def test_roles_copy_is_replace() -> None:
    sites = [s for f in _facts() for s in f.sites]
    assert len(sites) > 100
    for role in ("test", "benchmark", "production"):
        for s in sites:
            _same(_with_role(s, role), dataclasses.replace(s, role=role))
    moved = [dataclasses.replace(s, path=f"{d}/{s.path}") for s in sites for d in ("tests", "benchmarks", "src")]
    before = [s if (r := conventional_role(s.path)) == "production" else dataclasses.replace(s, role=r) for s in moved]
    after = with_roles(moved)
    assert len({s.role for s in after}) >= 2
    for a, b in zip(after, before, strict=True):
        _same(a, b)


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    name: str
    size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", max(self.size, 0))


@dataclasses.dataclass(frozen=True, slots=True)
class _Pair:
    name: str
    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Wider(_Pair):
    extra: int = 0


def test_other_classes() -> None:
    assert builder(_Checked) is _Checked  # its `__post_init__` runs: constructed
    assert replacer(_Checked, ("size",))(_Checked("a", 1), -3) == _Checked("a", 0)
    _same(builder(_Pair)("a", 2), _Pair("a", 2))
    _same(replacer(_Pair, ("size",))(_Pair("a", 2), 5), _Pair("a", 5))
    _same(replacer(_Pair, ("size",))(_Wider("a", 2, 7), 5), _Wider("a", 5, 7))  # a subclass: `replace`
    with pytest.raises(ValueError):
        replacer(_Pair, ("other",))
