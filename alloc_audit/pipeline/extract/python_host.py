"""Stage 3, extract (Python): whether the tensor a ``*_like`` copies its
device from is provably a host tensor within the function.

The source is a local (or an entry of a local, ``enc["input_ids"]``) that
every assignment in the enclosing function binds to a host producer:
``torch.from_numpy(...)``, ``torch.tensor(...)`` / ``torch.as_tensor(...)``
without a device, a call with ``return_tensors="pt"`` (a tokenizer's
output), or anything ending in ``.cpu()`` / ``.numpy()``; or an entry of a
local bound so. A parameter, an attribute, a value moved on
(``.to(...)``/``.cuda()``) or a name bound any other way stays
``device: unknown``. Pure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .python import PythonExtractor

_SOURCE = re.compile(r"([A-Za-z_]\w*)(?:\[\s*(?:\"[^\"]*\"|'[^']*')\s*\])?")
_FACTORY = re.compile(r"torch\.(?:from_numpy|tensor|as_tensor)\s*\(")
_PT = re.compile(r"""return_tensors\s*=\s*["']pt["']""")
_NEEDLES = (b"from_numpy", b"torch.tensor", b"as_tensor", b"return_tensors", b".cpu()", b".numpy()")
_MOVES = re.compile(r"\.(?:to|cuda)\s*\(|device\s*=")


def host_source(ext: PythonExtractor, node: Any, text: str) -> bool:
    """``text`` (the ``*_like`` argument) is a host tensor in ``node``'s function."""
    m = _SOURCE.fullmatch(text.strip())
    if m is None:
        return False
    name = m.group(1)
    body = node.parent
    while body is not None and body.type != "function_definition":
        body = body.parent
    if body is None:
        return False
    if not any(n in ext.src.data[body.start_byte:node.start_byte] for n in _NEEDLES):
        return False  # no host producer in the function at all (most functions)
    params = body.child_by_field_name("parameters")
    if params is not None and re.search(rf"\b{re.escape(name)}\b", ext.src.text(params, 2000)):
        return False
    source = ext.src.data[body.start_byte:node.start_byte].decode("utf-8", "replace")
    values = [_value(source, hit.end()) for hit in
              re.finditer(rf"^[ \t]*{re.escape(name)}[ \t]*(?:\[[^\]\n]*\])?[ \t]*=(?!=)[ \t]*", source, re.M)]
    if not values or re.search(rf"^[ \t]*[^\n=#]*,[ \t]*{re.escape(name)}\b[^\n=]*=(?!=)", source, re.M):
        return False  # unbound above, or unpacked from something
    return all(_host(v) for v in values)


def _value(source: str, start: int) -> str:
    """The right-hand side from ``start`` to the end of its statement
    (brackets balanced across lines)."""
    depth = 0
    for i, ch in enumerate(source[start:start + 4000]):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "\n" and depth <= 0:
            return source[start:start + i]
    return source[start:start + 4000]


def _host(value: str) -> bool:
    value = value.strip()
    if value.endswith((".cpu()", ".numpy()")):
        return True
    if _MOVES.search(value):
        return False
    return _FACTORY.match(value) is not None or (_PT.search(value) is not None and value.endswith(")"))
