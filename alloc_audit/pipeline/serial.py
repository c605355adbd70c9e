"""Compact, fast tuple form of the facts, for the cache (``marshal``).

A positional form that loads several times faster than JSON, which matters when a
warm run loads the facts of a thousand files. The encoder and decoder of
each dataclass are generated once from its type hints, so adding a field to
a fact needs no change here (the tool version in the cache key retires old
entries).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from ..slots import slot_setters as _slot_setters

T = TypeVar("T")

_encoders: dict[Any, Callable[[Any], Any]] = {}
_decoders: dict[Any, Callable[[Any], Any]] = {}


def encode(obj: Any) -> Any:
    return _encoder(type(obj))(obj)


def decode(cls: type[T], data: Any) -> T:
    return typing.cast(T, _decoder(cls)(data))


def _identity(value: Any) -> Any:
    return value


def _optional_inner(tp: Any) -> Any | None:
    if get_origin(tp) in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return None


def _encoder(tp: Any) -> Callable[[Any], Any]:
    found = _encoders.get(tp)
    if found is not None:
        return found
    inner = _optional_inner(tp)
    fn: Callable[[Any], Any]
    if inner is not None:
        enc = _encoder(inner)
        fn = _identity if enc is _identity else (lambda v: None if v is None else enc(v))
    elif get_origin(tp) is tuple:
        item = _encoder(get_args(tp)[0])
        fn = tuple if item is _identity else (lambda v: tuple(item(x) for x in v))
    elif isinstance(tp, type) and issubclass(tp, Enum):
        fn = _enum_value
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        fn = _generate_encoder(tp)
    else:
        fn = _identity
    _encoders[tp] = fn
    return fn


def _enum_value(v: Any) -> Any:
    return v.value


def _decoder(tp: Any) -> Callable[[Any], Any]:
    found = _decoders.get(tp)
    if found is not None:
        return found
    inner = _optional_inner(tp)
    fn: Callable[[Any], Any]
    if inner is not None:
        dec = _decoder(inner)
        fn = _identity if dec is _identity else (lambda v: None if v is None else dec(v))
    elif get_origin(tp) is tuple:
        item = _decoder(get_args(tp)[0])
        fn = tuple if item is _identity else (lambda v: tuple([item(x) for x in v]))
    elif isinstance(tp, type) and issubclass(tp, Enum):
        members = {m.value: m for m in tp}
        fn = members.__getitem__
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        fn = _generate_decoder(tp)
    else:
        fn = _identity
    _decoders[tp] = fn
    return fn


def _generate_encoder(cls: type) -> Callable[[Any], Any]:
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    env: dict[str, Any] = {}
    parts = []
    for i, name in enumerate(names):
        enc = _encoder(hints[name])
        if enc is _identity:
            parts.append(f"o.{name}")
        else:
            env[f"e{i}"] = enc
            parts.append(f"e{i}(o.{name})")
    src = f"def enc(o):\n    return ({', '.join(parts)},)\n"
    exec(src, env)
    return typing.cast(Callable[[Any], Any], env["enc"])


def _generate_decoder(cls: type) -> Callable[[Any], Any]:
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    env: dict[str, Any] = {"cls": cls}
    parts = []
    for i, name in enumerate(names):
        dec = _decoder(hints[name])
        if dec is _identity:
            parts.append(f"d[{i}]")
        else:
            env[f"d{i}"] = dec
            parts.append(f"d{i}(d[{i}])")
    slots = _slot_setters(cls, names)
    if slots is None:
        src = f"def dec(d):\n    return cls({', '.join(parts)})\n"
    else:  # what the generated ``__init__`` does, without its ``object.__setattr__`` per field (round 34)
        env["new"] = object.__new__
        sets = "".join(f"    s{i}(o, {part})\n" for i, part in enumerate(parts))
        env.update((f"s{i}", setter) for i, setter in enumerate(slots))
        src = f"def dec(d):\n    o = new(cls)\n{sets}    return o\n"
    exec(src, env)
    return typing.cast(Callable[[Any], Any], env["dec"])


@functools.cache
def schema_digest(cls: type) -> str:
    """A digest of a dataclass's field layout, nested dataclasses included:
    part of the cache key, so a change to the facts retires old entries even
    before the version number moves. Once per class and process."""
    import hashlib

    seen: set[type] = set()
    parts: list[str] = []

    def visit(tp: Any) -> None:
        inner = _optional_inner(tp)
        if inner is not None:
            visit(inner)
            return
        if get_origin(tp) is tuple:
            for arg in get_args(tp):
                if arg is not Ellipsis:
                    visit(arg)
            return
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
            seen.add(tp)
            hints = get_type_hints(tp)
            fields = ",".join(f"{f.name}:{hints[f.name]}" for f in dataclasses.fields(tp))
            parts.append(tp.__name__ + "(" + fields + ")")
            for f in dataclasses.fields(tp):
                visit(hints[f.name])

    visit(cls)
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()
