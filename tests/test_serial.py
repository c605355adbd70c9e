"""pipeline/serial: the decoder that sets a frozen slotted dataclass's slots
itself (round 34, instead of calling its generated ``__init__``) builds the
same objects as the class's constructor, and a class whose construction
does more than set its fields is still built through it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fixtures_harness import extracted_facts

from alloc_audit.model import FileFacts, Site
from alloc_audit.pipeline import serial

PROJECT = Path(__file__).parent / "fixtures" / "python" / "project-expansion-rounds"
FILES = ("csrc/engine.cc", "csrc/pool.cc", "pkg/__init__.py", "pkg/engine.py", "pkg/raw.py", "pkg/pools.py")


def _rebuilt(value: Any) -> Any:
    """``value`` built again through the constructors, field by field."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)(*(_rebuilt(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, tuple):
        return tuple(_rebuilt(v) for v in value)
    return value


def test_decoded_facts_are_the_constructed_ones() -> None:
    facts = extracted_facts(PROJECT, FILES)
    assert any(f.sites for f in facts.values())
    for f in facts.values():
        decoded = serial.decode(FileFacts, serial.encode(f))
        assert decoded == f == _rebuilt(decoded)
        assert hash(decoded.sites) == hash(f.sites) and repr(decoded) == repr(f)
        assert serial.encode(decoded) == serial.encode(f)


def test_the_facts_classes_take_the_slots_path() -> None:
    fields = [f.name for f in dataclasses.fields(Site)]
    assert serial._slot_setters(Site, fields) is not None
    assert serial._slot_setters(FileFacts, [f.name for f in dataclasses.fields(FileFacts)]) is not None


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    name: str
    size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", max(self.size, 0))


@dataclasses.dataclass(frozen=True)
class _Plain:  # no slots: built through its constructor
    name: str


def test_a_class_doing_more_than_setting_its_fields_is_constructed() -> None:
    assert serial._slot_setters(_Checked, ["name", "size"]) is None
    assert serial._slot_setters(_Plain, ["name"]) is None
    assert serial.decode(_Checked, ("a", -3)) == _Checked("a", 0)
    assert serial.decode(_Checked, ("a", -3)).size == 0
    assert serial.decode(_Plain, ("b",)) == _Plain("b")
