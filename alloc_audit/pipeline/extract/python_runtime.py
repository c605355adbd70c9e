"""Receivers that are another runtime's module, not a tensor: `tvm.cuda(0)`,
`tvm.runtime.cuda(0)` (`import tvm`, `from pkg import tvm`) return that
runtime's device handle; nothing is copied to the GPU. Part of the Python
extractor (``python_sites.make_site``)."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from ..names import IDENTIFIER
from .common import enclosing

if TYPE_CHECKING:
    from .python import PythonExtractor


@dataclasses.dataclass(slots=True)
class Names:
    """A file's names: the modules ``import X`` / ``import X.y as Z`` binds,
    and (found on first use) the names bound at module level other than by
    an import."""

    modules: set[str] = dataclasses.field(default_factory=set)
    top_level: set[str] | None = None


_CHAIN = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# a name bound other than by an import: `x = ...`, `x: T = ...`, `for x in`, `x :=`, a parameter
_BOUND = re.compile(r"^[ \t]*([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)|\bfor[ \t]+([A-Za-z_]\w*)[ \t]+in\b|"
                    r"\b([A-Za-z_]\w*)[ \t]*:=|\bdef[ \t]+\w+[ \t]*\(([^)]*)\)", re.M)


def runtime_handle(ext: PythonExtractor, node: Any) -> bool:
    """The call's receiver is a module of another runtime, named by an
    import: ``import X`` (``X.cuda(0)``; a chain ``X.a.cuda(0)`` only when
    X is a runtime package) or ``from P import N`` where N or P's package
    is one (``from pkg import tvm``, ``from tvm import runtime``). Never
    torch, never a name the file binds another way (a local, a parameter)."""
    fn = node.children[0]
    receiver = fn.child_by_field_name("object") if fn.type == "attribute" else None
    if receiver is None or receiver.type not in ("identifier", "attribute"):
        return False
    text = ext.src.text(receiver, 120)
    head, _, rest = text.partition(".")
    target = ext.aliases.get(head)
    if target is None or not _CHAIN.fullmatch(text):
        return False
    parts = target.split(".")
    if parts[0] == "torch":
        return False
    runtimes = ext.apis.py_other_runtimes
    if head in ext.bound.modules:
        runtime = not rest or parts[0] in runtimes
    else:
        runtime = parts[-1] in runtimes or parts[0] in runtimes
    if not runtime:
        return False
    if ext.bound.top_level is None:  # bound at module level, found once per file
        ext.bound.top_level = _bound_names(ext.src.data, top_level=True)
    if head in ext.bound.top_level:
        return False
    body = enclosing(node.parent, "function_definition")
    return body is None or head not in _bound_names(ext.src.data[body.start_byte:body.end_byte], top_level=False)


def _bound_names(data: bytes, top_level: bool) -> set[str]:
    """The names ``data`` binds other than by an import (``top_level``: only
    statements at column 0, not a function's parameters)."""
    found: set[str] = set()
    source = data.decode("utf-8", "replace")
    for m in _BOUND.finditer(source):
        if m.group(4) is not None:
            if not top_level:
                found.update(IDENTIFIER.findall(m.group(4)))
        elif not top_level or m.start() == 0 or (source[m.start() - 1] == "\n" and not source[m.start()].isspace()):
            found.add(m.group(1) or m.group(2) or m.group(3))
    return found
