"""Allocations that hold no memory because a fake tensor mode runs them:
the body of a function registered as an operator's fake/abstract/meta
implementation (``@torch.library.register_fake("ns::op")``,
``@op.register_fake``, ``@impl_abstract(...)``, ``@register_meta(...)``,
``@torch.library.impl(lib, "op", "Meta")``), also through a name bound to
one of those decorators in the file (``_fake = torch.library.register_fake``,
or a function whose ``return`` hands one out, then ``@_fake("ns::op")``, or a
decorator factory returning such a function), or registered by a call at the
start of a line (``torch.library.register_fake("ns::op")(fn)``: ``fn`` is
the fake implementation) or handed to a registration as a keyword argument
named for it (``direct_register_custom_op("op", op_func=f,
fake_impl=f_fake)``, ``gen_fake=f_fake``: a keyword that names a fake
implementation, given a plain name),
and code lexically inside
``with FakeTensorMode(...):`` or ``with fake_mode:`` where ``fake_mode`` is
bound to ``FakeTensorMode(...)`` in the same function. Part of the Python
extractor (``python_sites.py``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .python import PythonExtractor

# a file without one of these words has no fake scope (the cheap gate)
_WORDS = (b"register_fake", b"impl_abstract", b"register_meta", b"FakeTensorMode", b"Meta", b"fake")
_FAKE_DECORATOR = re.compile(
    r"""^@\s*(?:[\w.]+\.)?(?:register_fake|impl_abstract|register_meta|register_fake_class)\b"""
    r"""|^@\s*(?:torch\.)?(?:library\.)?impl\(.*["']Meta["']\s*\)\s*$""", re.S)
_FAKE_MODE_CALL = re.compile(r"^(?:[\w.]+\.)?FakeTensorMode\(")
_FAKE_NAME = rb"(?:[\w.]+\.)?(?:register_fake|impl_abstract|register_meta)\b"
# one of them in each pattern; one of the first three in each but the keyword's (`_FAKE_KEYWORD`)
_NAME_WORDS = (b"register_fake", b"impl_abstract", b"register_meta", b"fake")
# `_fake = torch.library.register_fake` (module level or in a branch)
_ALIAS = re.compile(rb"^[ \t]*([A-Za-z_]\w*)[ \t]*=[ \t]*" + _FAKE_NAME, re.M)
# `def _fake(...):` whose body returns one (`return torch.library.register_fake(op)`)
_WRAPPER = re.compile(rb"^([ \t]*)def[ \t]+([A-Za-z_]\w*)\(", re.M)
_RETURNS_FAKE = re.compile(rb"^([ \t]+)return[ \t]+" + _FAKE_NAME, re.M)
_ALIAS_DECORATOR = re.compile(r"^@\s*([A-Za-z_]\w*)\b")
# `torch.library.register_fake("ns::op")(fn)`: the call form of the decorator
_REGISTERED = re.compile(
    rb"^[ \t]*" + _FAKE_NAME + rb"\((?:[^()\n]|\([^()\n]*\))*\)\(\s*([A-Za-z_]\w*)\s*\)", re.M)
# `impl_abstract("ns::op", fn)`, `torch.library.register_fake("ns::op", fn)`: the function
# handed as the second argument (the older call form, over lines), or a name bound to a decorator
# (`impl_abstract = torch.library.register_fake`) called so
_REGISTERED_ARG = re.compile(
    rb"^[ \t]*(?:" + _FAKE_NAME + rb"|([A-Za-z_]\w*))\(\s*(?:[rf]?\"[^\"\n]*\"|[rf]?'[^'\n]*')\s*,\s*"
    rb"(?:func\s*=\s*)?([A-Za-z_]\w*)\s*,?\s*\)", re.M)


# `fake_impl=f_fake` / `gen_fake=f_fake` in a call's arguments: a registration's fake implementation
# (the keyword names the implementation: `fake`, `*_fake`, `fake_impl`/`_fn`/`_func`; not `fake_mode=`, `fake_pg=`)
_FAKE_KEYWORD = re.compile(
    rb"(?<=[(,])\s*(?:\w*_)?fake(?:_impl|_fn|_func|_function)?[ \t]*=[ \t]*([A-Za-z_]\w*)\s*(?=[,)])")


def fake_keywords(data: bytes) -> list[bytes]:
    """The names ``_FAKE_KEYWORD.finditer(data)`` finds, in order, without
    running the pattern over the whole file: a match spells `fake` and holds
    only blanks, word characters and `=` after the `(` or `,` it follows, so
    it starts right after the last `(`/`,` before some `fake`; the pattern is
    tried there only (once per such place; tests/test_extract_memos.py)."""
    found: list[bytes] = []
    tried: set[int] = set()
    at = data.find(b"fake")
    while at >= 0:
        start = max(data.rfind(b"(", 0, at), data.rfind(b",", 0, at)) + 1
        if start > 0 and start not in tried:
            tried.add(start)
            m = _FAKE_KEYWORD.match(data, start)
            if m is not None:
                found.append(m.group(1))
        at = data.find(b"fake", at + 4)
    return found


def may_have_fake_scopes(source: bytes) -> bool:
    return any(word in source for word in _WORDS)


def in_fake_scope(ext: PythonExtractor, node: Any) -> bool:
    """Whether ``node`` runs under a fake tensor mode (see the module text)."""
    src = ext.src
    parent = node.parent
    while parent is not None:
        kind = parent.type
        if kind == "with_statement" and _fake_with(ext, parent):
            return True
        if kind == "function_definition":
            name = parent.child_by_field_name("name")
            if name is not None and src.text(name, 100) in fake_aliases(ext):
                return True
            holder = parent.parent
            if holder is not None and holder.type == "decorated_definition":
                for child in holder.children:
                    if child.type == "decorator" and _fake_decorator(ext, src.text(child, 300)):
                        return True
        parent = parent.parent
    return False


def _fake_decorator(ext: PythonExtractor, text: str) -> bool:
    if _FAKE_DECORATOR.search(text):
        return True
    m = _ALIAS_DECORATOR.match(text)
    return m is not None and m.group(1) in fake_aliases(ext)


def fake_aliases(ext: PythonExtractor) -> frozenset[str]:
    """Names the file binds to a fake-impl decorator (an assignment of one,
    or a function that returns one) and the functions it registers as fake
    implementations by a call. Read once per file, from the bytes."""
    if ext.fake_aliases is None:
        data = ext.src.data
        if not any(word in data for word in _NAME_WORDS):
            ext.fake_aliases = frozenset()  # each pattern below spells one of them: no search of the file
            return ext.fake_aliases
        if not any(word in data for word in _NAME_WORDS[:3]):
            # every pattern but the keyword's spells one of the decorator names (`_REGISTERED_ARG`'s
            # other form counts only a name bound to one): the keyword's names alone, one search
            ext.fake_aliases = frozenset(n.decode() for n in fake_keywords(data) if n != b"None")
            return ext.fake_aliases
        names = {m.group(1).decode() for m in _ALIAS.finditer(data)}
        aliases = frozenset(names)  # names bound to a decorator: their call form registers too
        names.update(m.group(1).decode() for m in _REGISTERED.finditer(data))
        names.update(n.decode() for n in fake_keywords(data) if n != b"None")
        names.update(m.group(2).decode() for m in _REGISTERED_ARG.finditer(data)
                     if m.group(1) is None or m.group(1).decode() in aliases)
        for ret in _RETURNS_FAKE.finditer(data):
            # the innermost `def` above the `return`, indented less
            indent = len(ret.group(1))
            defs = list(_WRAPPER.finditer(data, 0, ret.start()))
            for i in range(len(defs) - 1, -1, -1):
                m = defs[i]
                if len(m.group(1)) < indent:
                    names.add(m.group(2).decode())
                    names.update(_factories(data, defs[:i], m))
                    break
        ext.fake_aliases = frozenset(names)
    return ext.fake_aliases


def _factories(data: bytes, above: list[re.Match[bytes]], inner: re.Match[bytes]) -> set[str]:
    """A decorator factory around ``inner`` (``def register_op(name): def
    decorator(fn): return register_fake(name)(fn); return decorator``):
    the enclosing ``def``, indented less, that returns ``inner`` by name."""
    indent = len(inner.group(1))
    for m in reversed(above):
        if len(m.group(1)) < indent:
            body = data[data.find(b"\n", m.end()) + 1:]  # from the line after the `def`
            end = re.search(rb"^[ \t]{0,%d}\S" % len(m.group(1)), body, re.M)
            body = body[:end.start()] if end is not None else body
            if re.search(rb"^[ \t]+return[ \t]+" + inner.group(2) + rb"[ \t]*$", body, re.M):
                return {m.group(2).decode()}
            return set()
    return set()


def _fake_with(ext: PythonExtractor, node: Any) -> bool:
    src = ext.src
    for clause in node.children:
        if clause.type != "with_clause":
            continue
        for item in clause.children:
            if item.type != "with_item":
                continue
            value = item.child_by_field_name("value")
            if value is None:
                continue
            if value.type == "as_pattern" and value.children:
                value = value.children[0]
            text = src.text(value, 200).strip()
            if _FAKE_MODE_CALL.match(text):
                return True
            if value.type == "identifier" and _bound_to_fake_mode(ext, node, text):
                return True
    return False


def _bound_to_fake_mode(ext: PythonExtractor, node: Any, name: str) -> bool:
    """``name = torch._subclasses.FakeTensorMode(...)`` in the function (or
    module) that holds the ``with``."""
    scope = node.parent
    while scope is not None and scope.type not in ("function_definition", "module"):
        scope = scope.parent
    if scope is None:
        return False
    body = ext.src.data[scope.start_byte:node.start_byte].decode("utf-8", "replace")
    return re.search(rf"(?<![\w.]){re.escape(name)}\s*=\s*(?:[\w.]+\.)?FakeTensorMode\(", body) is not None
