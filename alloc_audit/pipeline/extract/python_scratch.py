"""Stage 3, extract (Python): allocations an expression consumes and drops.

A site bound to no name whose memory the expression around it reads and
drops (issue 11, rounds 8-9): an operand of arithmetic, an argument of a
torch function that always makes a new tensor, an in-place addition into
another tensor, a comprehension that reads its elements as numbers, or the
start of a method chain that ends in a new tensor or casts it to another
dtype; round 27: an argument of a torch function that returns a Python
value (``torch.allclose``), an element of the sequence a join copies
(``torch.cat((x, torch.arange(n)))``). ``python_sites`` marks
such a site ``kept="local"``: a temporary, whatever its scope's name says.
Round 29: at module level too (``v = (torch.arange(n) / n).repeat(k)``), and
there also an argument of a call that keeps nothing of it
(``handed_and_dropped``): a collective or a copy (the catalogue's
``[non-retaining]``), a builtin that reads it (``print``), or the gradient
seeding ``.backward(...)``: the statement drops it when it ends, while a
module-level name would keep it to the end of the script. Pure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..names import IDENTIFIER
from .common import enclosing
from .python_kept import NEW_TENSOR, NOT_ITSELF, VIEW_METHODS

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
    if wrapper is not None and wrapper not in NEW_TENSOR and wrapper not in _RESHAPING and wrapper not in _TO_VALUE:
        return False
    up = ext.up.parent
    parent = up(node)
    while parent is not None and parent.type == "parenthesized_expression":
        parent = up(parent)
    if parent is None:
        return False
    if parent.type in ("tuple", "list"):
        return _joined(ext, parent)
    if parent.type == "binary_operator":
        op = parent.child_by_field_name("operator")
        return op is not None and ext.src.text(op, 4) in _ARITHMETIC and not _registered_result(ext, parent)
    if parent.type == "augmented_assignment":  # `w += torch.eye(n)`: added into w and dropped
        return bool(parent.child_by_field_name("right") == node)
    if parent.type == "for_in_clause" and parent.child_by_field_name("right") == node:
        return _read_as_numbers(ext, parent)
    if parent.type != "argument_list" or wrapper is None:
        return False
    if wrapper in NEW_TENSOR or wrapper in _TO_VALUE:
        return True
    call = up(parent)
    local = ext.rhs_targets.get(call.start_byte) if call is not None else None
    if call is not None and local is None:
        local = _chain_target(ext, call)
    return bool(local) and IDENTIFIER.fullmatch(local or "") is not None and _read_only_by_new(ext, call, local or "")


# the gradient that seeds a backward pass: autograd reads it and keeps none of it
_SEEDS = frozenset({"backward"})
# builtins that read a tensor and return no tensor (`max(t)`, `zip(t, u)` hand out its elements, views of it)
_TO_PYTHON = frozenset({"print", "len", "str", "repr", "int", "float", "bool", "isinstance", "id", "hash", "type",
                        "format"})


def constructor_temporary(ext: PythonExtractor, node: Any, wrapper: str | None, operand: bool) -> bool:
    """A constructor's allocation bound to no name that its statement reads
    and drops: with ``operand`` (not a ``.to(...)`` copy) an
    ``intermediate``; (round 35) or one handed to a call the catalogue lists
    as non-retaining (``convert_cute_tensor(ref.cuda(), self.c_ct, ...)``),
    not to a method of the object (``self.all_reduce(...)``: the project's
    own, which may keep it)."""
    return operand and intermediate(ext, node, wrapper) or (
        wrapper is not None and not wrapper.startswith(("self.", "cls.")) and handed_and_dropped(ext, node, wrapper))


def module_temporary(ext: PythonExtractor, node: Any, wrapper: str | None) -> bool:
    """A module-level allocation bound to no name that its statement reads
    and drops: an ``intermediate`` or ``handed_and_dropped`` (round 29)."""
    return intermediate(ext, node, wrapper) or handed_and_dropped(ext, node, wrapper)


def handed_and_dropped(ext: PythonExtractor, node: Any, wrapper: str | None) -> bool:
    """The allocation (bound to no name) is an argument of a call that keeps
    nothing of it: a collective or a copy the catalogue lists as
    non-retaining (`dist.all_reduce(torch.ones(1).to(d))`), a builtin that
    reads it (`print(x.cuda())`), or the gradient seeding a backward pass
    (`y.backward(torch.ones_like(y))`). The call's own result is never it."""
    if wrapper is None:
        return False
    leaf = wrapper.rsplit(".", 1)[-1]
    if leaf not in ext.apis.py_non_retaining and leaf not in _SEEDS and wrapper not in _TO_PYTHON:
        return False
    up = ext.up.parent
    parent = up(node)
    while parent is not None and parent.type == "parenthesized_expression":
        parent = up(parent)
    if parent is not None and parent.type == "keyword_argument":
        parent = up(parent)
    return parent is not None and parent.type == "argument_list"


# torch functions that read tensors and return a Python value (`torch.allclose(x, torch.ones(1))`)
_TO_VALUE = frozenset({"torch.allclose", "torch.equal"})
# torch functions that copy the tensors of the sequence they are given into a new one
_JOINS = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.hstack",
                    "torch.vstack"})


def _joined(ext: PythonExtractor, seq: Any) -> bool:
    """The allocation is an element of the sequence a join copies into a new
    tensor (`torch.cat((self.ids, torch.arange(n)))`): dropped once copied."""
    up = ext.up.parent
    args = up(seq)
    if args is None or args.type != "argument_list" or args.named_children[0] != seq:
        return False
    call = up(args)
    if call is None or call.type != "call":
        return False
    fn = call.child_by_field_name("function")
    if fn is None:
        return False
    shown, dotted, _ = ext.callee_of(fn)
    return (dotted or shown) in _JOINS


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


def dropped_in_chain(ext: PythonExtractor, node: Any, source: str | None = None) -> bool:
    """The allocation is the start of a method chain that, through
    conversions and views that may return it (`.to(torch.int64)`,
    `.long()`), ends in a method whose result is never the tensor it is
    called on (`.abs()`, `.sum()`, `.tolist()`): the allocation is dropped
    at once, only the chain's result is kept. So is one of which only
    metadata is read (`torch.empty([], device="cuda").device`), and one
    whose views are added in place into another tensor (`rank +=
    torch.arange(n, device=d).view(h, 1)`): dropped once added. So is one
    a conversion copies to another dtype (``source``, the allocation's dtype
    from ``dtype_of``: `torch.randint(k, s).to(torch.uint8)`, `torch.zeros(n,
    dtype=torch.float32).bool()`): a cast to a different dtype always makes
    a new tensor (round 27)."""
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
        if name in NOT_ITSELF:
            return True
        if name not in _CONVERSIONS:
            return False
        if source is not None and cur is node and _casts(source, name, outer, ext):
            return True
        cur = outer
    return False


# the dtype a conversion method gives (`x.long()`), and the names a dtype has (`torch.long` is `torch.int64`)
_METHOD_DTYPES = {"long": "int64", "int": "int32", "half": "float16", "float": "float32", "double": "float64",
                  "bool": "bool", "bfloat16": "bfloat16"}
_ALIASES = {"long": "int64", "int": "int32", "short": "int16", "half": "float16", "float": "float32",
            "double": "float64", "cfloat": "complex64", "cdouble": "complex128"}
_DTYPE = re.compile(r"torch\.([a-z]\w*)")
# factories whose dtype, when none is given, is the default floating type (whatever set_default_dtype made it),
# or int64
_DEFAULT_FLOAT = frozenset(f"torch.{n}" for n in ("rand", "randn", "zeros", "ones", "empty", "eye", "linspace",
                                                  "logspace"))
_DEFAULT_INT64 = frozenset({"torch.randint", "torch.randperm"})
FLOATING = "floating"  # the default floating type: its width is not told


def dtype_of(api: str, dtype: str | None) -> str | None:
    """The dtype an allocation is made with: the literal it is given
    (`dtype=torch.float32`), else its factory's default (``FLOATING`` for
    `torch.zeros(n)`, `int64` for `torch.randint`); None when not told."""
    if dtype is not None:
        m = _DTYPE.fullmatch(dtype.strip())
        return None if m is None else _ALIASES.get(m.group(1), m.group(1))
    if api in _DEFAULT_FLOAT:
        return FLOATING
    return "int64" if api in _DEFAULT_INT64 else None


def _family(dtype: str) -> str:
    return "bool" if dtype == "bool" else "floating" if dtype == FLOATING or "float" in dtype else dtype[:3]


def _casts(source: str, method: str, call: Any, ext: PythonExtractor) -> bool:
    """The conversion ``call`` (`.long()`, `.to(torch.uint8)`, `.to("cuda",
    dtype=torch.bool)`) gives a dtype other than ``source``: a copy."""
    target = _METHOD_DTYPES.get(method)
    if method == "to":
        args = call.child_by_field_name("arguments")
        found = _DTYPE.findall(ext.src.text(args, 200)) if args is not None else []
        names = [_ALIASES.get(n, n) for n in found if n not in ("device", "cuda")]
        target = names[0] if len(names) == 1 else None
    if target is None:
        return False
    if source == FLOATING:  # a float of unknown width: only another family is surely another dtype
        return _family(target) != FLOATING
    return target != source


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
            if method is None or ext.src.text(method, 40) not in VIEW_METHODS.split("|") \
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
        if m is None or ext.resolve_text(m.group(1)) not in NEW_TENSOR:
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
