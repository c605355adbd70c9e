"""Native factories whose options argument is a variable that names only the
host. libtorch has no default-device context: a factory whose options carry
no device makes a CPU tensor (``cpp_sites.classify_options``). That holds
when the options are a variable too:

- a variable typed as a scalar type (a parameter ``const torch::ScalarType&
  dtype`` or ``torch::Dtype dtype``, a local ``at::ScalarType t(...)``, a
  member ``dtype_`` the file declares ``torch::ScalarType dtype_;``): such a
  variable holds a dtype whatever its value, never a device;
- a local bound once, above the call and nowhere else, to a value that makes
  a host tensor (``torch::Device device(torch::kCPU);``, ``auto device =
  torch::kCPU;``, ``auto options = torch::dtype(t).device(device);`` with
  such a ``device``), followed through ``.device(x)`` and a chain of setters
  (``options.dtype(torch::kLong)``).

``expanded`` rewrites the options text with what its variables are bound to
(a scalar-typed variable as a dtype constant), for ``classify_options`` to
read; None when it names no variable it can follow. It runs only for a
factory the extractor would otherwise call ``device: unknown``, so it costs
nothing on the other sites. Part of the C++ extractor
(``cpp_sites.add_site``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from . import common

if TYPE_CHECKING:
    from .cpp import CppExtractor

# a variable, `this->dtype_`, optionally followed by setters: `options.dtype(torch::kInt)`
_HEAD = re.compile(r"(?:this->)?([A-Za-z_]\w*)((?:\.\w+(?:<[\w:]+>)?\([^()]*\))*)")
# `.device(device)`: a device given by a variable
_DEVICE_VARIABLE = re.compile(r"\.device\(([A-Za-z_]\w*)\)")
_SCALAR_TYPE = r"(?:(?:(?:at|torch|c10)::)?ScalarType|(?:at|torch|c10)::Dtype)"
_DTYPE = "torch::kFloat"  # what a scalar-typed variable stands for: some dtype, no device
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_NOT_A_TYPE = frozenset({"return", "case", "else", "throw", "co_return", "new", "delete"})


def expanded(ext: CppExtractor, node: Any, options: str) -> str | None:
    """``options`` with the variables it names replaced by what they are bound
    to, or None when it names none this can follow."""
    text = re.sub(r"\s+", "", options)
    head = _HEAD.fullmatch(text)
    if head is None and ".device(" not in text:
        return None
    fn = common.enclosing(node.parent, "function_definition")
    if fn is None:
        return None
    before = _COMMENT.sub(" ", ext.src.data[fn.start_byte:node.start_byte].decode("utf-8", "replace"))
    return _expand(text, before, ext.src.data, 0)


def _expand(text: str, before: str, data: bytes, depth: int) -> str | None:
    head = _HEAD.fullmatch(text)
    if head is not None:
        value = _value(head.group(1), before, data, depth)
        return value + head.group(2) if value is not None else None
    changed = False

    def device(m: re.Match[str]) -> str:
        nonlocal changed
        value = _value(m.group(1), before, data, depth)
        if value is None:
            return m.group(0)
        changed = True
        return f".device({value})"

    out = _DEVICE_VARIABLE.sub(device, text)
    return out if changed else None


def _value(name: str, before: str, data: bytes, depth: int) -> str | None:
    """What the variable ``name`` holds, as options text: a dtype constant
    for a scalar-typed variable, the expanded value of a local bound once
    above the call, else None."""
    n = re.escape(name)
    declared = [m for m in re.finditer(rf"(\b[\w:<>]+)\s*(?:const\s*)?&?\s*(?<![\w.>]){n}\s*([,)=;({{])", before)
                if m.group(1) not in _NOT_A_TYPE]
    if declared:
        if all(re.fullmatch(_SCALAR_TYPE, m.group(1)) for m in declared):
            return _DTYPE  # typed as a dtype: whatever it holds, no device
        if len(declared) != 1 or declared[0].group(2) not in "=({":
            return None  # a parameter of another type, or declared twice
        return _bound(declared[0], name, before, data, depth)
    # a member: the file declares it with a scalar type (`torch::ScalarType dtype_;`) and no other way
    fields = re.findall(rb"(\b[\w:<>]+)\s+" + re.escape(name.encode()) + rb"\s*[;={]", data)
    if fields and all(re.fullmatch(_SCALAR_TYPE, f.decode()) for f in fields):
        return _DTYPE
    return None


def _bound(decl: re.Match[str], name: str, before: str, data: bytes, depth: int) -> str | None:
    """The value of the one declaration ``decl`` of a local (`T name = v;`,
    `T name(v);`, `T name{v};`) when nothing assigns it again above the call."""
    rest = before[decl.end():]
    if decl.group(2) == "=":
        m = re.match(r"\s*([^;]*);", rest)
    else:
        closing = ")" if decl.group(2) == "(" else "}"
        m = re.match(rf"\s*([^;]*)\{closing}\s*;", rest)
    if m is None or depth >= 3:
        return None
    if re.search(rf"(?<![\w.>]){re.escape(name)}\s*=(?!=)", rest):
        return None  # assigned again
    value = re.sub(r"\s+", "", m.group(1))
    if not value:
        return None
    inner = _expand(value, before[:decl.start()], data, depth + 1)
    return inner if inner is not None else value
