"""Stage 3, extract (Python): allocations an expression consumes and drops.

A site bound to no name whose memory the expression around it reads and
drops (issue 11, rounds 8-9): an operand of arithmetic, an argument of a
torch function that always makes a new tensor, an in-place addition into
another tensor, a comprehension that reads its elements as numbers, or the
start of a method chain that ends in a new tensor. ``python_sites`` marks
such a site ``kept="local"``: a temporary, whatever its scope's name says.
Pure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .common import enclosing
from .python_kept import _LOCAL, _NEW_TENSOR, _NOT_ITSELF, _VIEW_METHODS

if TYPE_CHECKING:
    from .python import PythonExtractor

# pure reshaping functions: the result may be a view of the allocation
_RESHAPING = frozenset({"einops.rearrange", "einops.repeat", "einops.reduce"})
_ARITHMETIC = frozenset({"+", "-", "*", "/", "//", "%", "**", "@"})


def intermediate(ext: PythonExtractor, node: Any, wrapper: str | None) -> bool:
    """The allocation ``node`` (bound to no name) is consumed by the
    expression around it and never kept (issue 11, round 8): an operand of
    arithmetic (`torch.rand(n) * k`: the result is a new tensor), an
    argument of a torch function that always makes a new tensor
    (`torch.log(torch.ones(n))`), or of a pure reshaping function whose
    result goes to a local read only by such functions
    (`A = repeat(torch.arange(n), ...).contiguous()` then `torch.log(A)`).
    A registration (`nn.Parameter(k * torch.ones(n))`) is not one."""
    if wrapper is not None and wrapper not in _NEW_TENSOR and wrapper not in _RESHAPING:
        return False
    up = ext.up.parent
    parent = up(node)
    while parent is not None and parent.type == "parenthesized_expression":
        parent = up(parent)
    if parent is None:
        return False
    if parent.type == "binary_operator":
        op = parent.child_by_field_name("operator")
        return op is not None and ext.src.text(op, 4) in _ARITHMETIC and not _registered_result(ext, parent)
    if parent.type == "augmented_assignment":  # `w += torch.eye(n)`: added into w and dropped
        return bool(parent.child_by_field_name("right") == node)
    if parent.type == "for_in_clause" and parent.child_by_field_name("right") == node:
        return _read_as_numbers(ext, parent)
    if parent.type != "argument_list" or wrapper is None:
        return False
    if wrapper in _NEW_TENSOR:
        return True
    call = up(parent)
    local = ext.rhs_targets.get(call.start_byte) if call is not None else None
    if call is not None and local is None:
        local = _chain_target(ext, call)
    return bool(local) and _LOCAL.fullmatch(local or "") is not None and _read_only_by_new(ext, call, local or "")


_NUMBER = r"(?:\.(?:item|tolist)\(\s*\)|\s*\))"


def _read_as_numbers(ext: PythonExtractor, clause: Any) -> bool:
    """A comprehension over the allocation (`[round(float(k), 2) for k in
    np.arange(lo, 1.0, step)]`, `{k.item(): 0.0 for k in ...}`) that reads
    each element as a number only (`k.item()`, `float(k)`): nothing of the
    array is kept."""
    left = clause.child_by_field_name("left")
    comp = clause.parent
    if left is None or left.type != "identifier" or comp is None:
        return False
    var = re.escape(ext.src.text(left, 40))
    text = ext.src.data[comp.start_byte:clause.start_byte].decode("utf-8", "replace")
    uses = list(re.finditer(rf"(?<![\w.]){var}\b", text))
    return bool(uses) and all(
        re.match(_NUMBER, text[m.end():]) and (text[m.end():].startswith(".")
                                               or re.search(r"\b(?:float|int|bool)\(\s*$", text[:m.start()]))
        for m in uses)


_CONVERSIONS = frozenset({"to", "long", "float", "half", "int", "bool", "bfloat16", "double", "contiguous", "view",
                          "reshape", "flatten", "squeeze", "unsqueeze", "transpose", "permute", "t", "detach"})


# attributes that read a tensor's metadata, never the tensor itself
_METADATA = frozenset({"device", "dtype", "shape", "layout", "ndim", "is_cuda", "itemsize"})


def dropped_in_chain(ext: PythonExtractor, node: Any) -> bool:
    """The allocation is the start of a method chain that, through
    conversions and views that may return it (`.to(torch.int64)`,
    `.long()`), ends in a method whose result is never the tensor it is
    called on (`.abs()`, `.sum()`, `.tolist()`): the allocation is dropped
    at once, only the chain's result is kept. So is one of which only
    metadata is read (`torch.empty([], device="cuda").device`), and one
    whose views are added in place into another tensor (`rank +=
    torch.arange(n, device=d).view(h, 1)`): dropped once added."""
    up = ext.up.parent
    cur = node
    for _ in range(6):
        parent = up(cur)
        if parent is not None and parent.type == "augmented_assignment" and cur is not node \
                and parent.child_by_field_name("right") == cur:
            return True
        if parent is None or parent.type != "attribute" or parent.child_by_field_name("object") != cur:
            return False
        method = parent.child_by_field_name("attribute")
        outer = up(parent)
        if method is not None and (outer is None or outer.type != "call") \
                and ext.src.text(method, 40) in _METADATA:
            return True  # `torch.empty([], device="cuda").device.index`: a probe, only its metadata read
        if method is None or outer is None or outer.type != "call":
            return False
        name = ext.src.text(method, 40)
        if name in _NOT_ITSELF:
            return True
        if name not in _CONVERSIONS:
            return False
        cur = outer
    return False


def _chain_target(ext: PythonExtractor, call: Any) -> str | None:
    """The name a view chain on ``call`` is assigned to (`A = f(x).contiguous()`)."""
    up = ext.up.parent
    child, parent = call, up(call)
    for _ in range(6):
        if parent is None:
            return None
        if parent.type == "assignment" and parent.child_by_field_name("right") == child:
            left = parent.child_by_field_name("left")
            return ext.src.text(left, 80) if left is not None else None
        if parent.type == "attribute" and parent.child_by_field_name("object") == child:
            method = parent.child_by_field_name("attribute")
            outer = up(parent)
            if method is None or ext.src.text(method, 40) not in _VIEW_METHODS.split("|") \
                    or outer is None or outer.type != "call":
                return None
            child, parent = outer, up(outer)
            continue
        return None
    return None


def _read_only_by_new(ext: PythonExtractor, call: Any, name: str) -> bool:
    """Every later mention of local ``name`` in its function is the first
    argument of a torch function that makes a new tensor."""
    body = enclosing(call, "function_definition")
    if body is None:
        return False
    after = ext.src.data[call.end_byte:body.end_byte].decode("utf-8", "replace")
    uses = [m.start() for m in re.finditer(rf"(?<![\w.]){re.escape(name)}\b", after)]
    if not uses:
        return False
    for at in uses:
        m = re.search(r"([\w.]+)\(\s*$", after[:at])
        if m is None or ext.resolve_text(m.group(1)) not in _NEW_TENSOR:
            return False
        if not re.match(rf"{re.escape(name)}\s*[,)]", after[at:]):
            return False
    return True


_REGISTRATION_CALL = r"(?:register_buffer|register_parameter|Parameter|\w*_parameter\w*)\s*\("


def _registered_result(ext: PythonExtractor, expr: Any) -> bool:
    """The arithmetic is assigned to a local (through parentheses and a
    conditional) that a registration later in the function takes whole
    (`scale = (torch.arange(n) + b) / c if base else None` ...
    `self.register_buffer("scale", scale)`): the allocation is registered
    module state (pipeline/module_state.py), not a dropped operand."""
    up = ext.up.parent
    parent = up(expr)
    for _ in range(8):
        if parent is None or parent.type not in ("binary_operator", "parenthesized_expression",
                                                  "conditional_expression", "unary_operator"):
            break
        parent = up(parent)
    if parent is None or parent.type != "assignment":
        return False
    left = parent.child_by_field_name("left")
    if left is None or left.type != "identifier":
        return False
    body = enclosing(parent, "function_definition")
    if body is None:
        return False
    name = re.escape(ext.src.text(left, 80))
    after = ext.src.data[parent.end_byte:body.end_byte].decode("utf-8", "replace")
    return re.search(_REGISTRATION_CALL + rf"[^()]*(?<![\w.]){name}\s*[,)]", after) is not None
