"""Building a frozen slotted dataclass's objects by setting their slots.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__`` (its own ``__setattr__`` raises); the slots' own
setters do the same in about half the time. Where that is all building an
object does (``slot_setters``), the functions generated here build it so:
the cache's decoders (``pipeline/serial.py``, round 34), a call table's
``Call`` objects (~120 k in the tier passes of a flashinfer scan) and a
site's copy with its code role (~10 k) (round 36). The objects are the
ones the class builds: equal, hashed and printed alike. Pure."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def slot_setters(cls: type, names: list[str]) -> list[Callable[[Any, Any], None]] | None:
    """The slots' own setters of ``names``, where building an object of ``cls`` is only setting them:
    its ``__init__`` is the one ``dataclass`` generates (no ``__post_init__``, every field an init
    argument, so it sets each field to its argument and does nothing else), ``__new__`` is
    ``object``'s, and each field is a slot; else None (build it by calling ``cls``)."""
    init, new = getattr(cls, "__init__", None), getattr(cls, "__new__", None)
    if getattr(cls, "__post_init__", None) is not None or new is not object.__new__ or \
            getattr(getattr(init, "__code__", None), "co_filename", "") != "<string>" or \
            not all(f.init for f in dataclasses.fields(cls)):
        return None
    setters = []
    for name in names:
        slot = next((k.__dict__[name] for k in cls.__mro__ if name in k.__dict__), None)
        if not isinstance(slot, types.MemberDescriptorType):
            return None
        setters.append(slot.__set__)
    return setters


def builder(cls: type[T]) -> Callable[..., T]:
    """``cls`` called with every field, positionally in field order: through the slots where
    ``slot_setters`` allows it, else ``cls`` itself."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]  # a dataclass
    setters = slot_setters(cls, names)
    if setters is None:
        return cls
    env: dict[str, Any] = {"cls": cls, "new": object.__new__}
    env.update((f"s{i}", setter) for i, setter in enumerate(setters))
    params = ", ".join(f"a{i}" for i in range(len(names)))
    sets = "".join(f"    s{i}(o, a{i})\n" for i in range(len(names)))
    exec(f"def build({params}):\n    o = new(cls)\n{sets}    return o\n", env)
    return typing.cast(Callable[..., T], env["build"])


def replacer(cls: type[T], changed: tuple[str, ...]) -> Callable[..., T]:
    """``replace(o, *values)``: ``dataclasses.replace(o, **dict(zip(changed, values)))`` (every field
    of ``o`` as it is, but ``changed`` set to ``values``), through the slots where ``slot_setters``
    allows it; an object not exactly of ``cls`` goes through ``dataclasses.replace``."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]  # a dataclass
    if not set(changed) <= set(names):
        raise ValueError(f"{cls.__name__} has no field {sorted(set(changed) - set(names))}")
    setters = slot_setters(cls, names)
    params = ", ".join(f"v{i}" for i in range(len(changed)))
    env: dict[str, Any] = {"cls": cls, "new": object.__new__, "replace": dataclasses.replace}
    keywords = ", ".join(f"{name}=v{i}" for i, name in enumerate(changed))
    if setters is None:
        src = f"def copy(o, {params}):\n    return replace(o, {keywords})\n"
    else:
        env.update((f"s{i}", setter) for i, setter in enumerate(setters))
        sets = "".join(f"    s{i}(n, {f'v{changed.index(name)}' if name in changed else f'o.{name}'})\n"
                       for i, name in enumerate(names))
        src = (f"def copy(o, {params}):\n    if type(o) is not cls:\n        return replace(o, {keywords})\n"
               f"    n = new(cls)\n{sets}    return n\n")
    exec(src, env)
    return typing.cast(Callable[..., T], env["copy"])
