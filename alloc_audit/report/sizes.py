"""Estimated bytes of a site, when its size arguments are literal or bound.

The arithmetic a memory review does by hand: ``torch.empty((n, hidden),
dtype=torch.bfloat16)`` with ``n = 3072`` and ``hidden = 6144`` is
3072 x 6144 x 2 B = 36.0 MiB. Names get values only from the user's bindings
(``[tool.alloc-audit] bindings`` or ``--bind NAME=VALUE``), matched by the
full dotted text first (``config.hidden_size``) and then by the last
attribute (``hidden_size``); a dtype expression (``config.dtype``) may be
bound to its element size in bytes. Anything else (a call, a subscript, an unbound
name, ``*size``) leaves the site without an estimate: a wrong number is worse
than none. The expressions are parsed, never evaluated by Python.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache

from ..model import Language, Site, SiteKind

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16,
    "cfloat": 8, "cdouble": 16,
}
SIZEOF: dict[str, int] = {
    "char": 1, "signed char": 1, "unsigned char": 1, "bool": 1, "int8_t": 1, "uint8_t": 1,
    "short": 2, "unsigned short": 2, "int16_t": 2, "uint16_t": 2, "half": 2, "__half": 2,
    "__nv_bfloat16": 2, "nv_bfloat16": 2, "at::Half": 2, "at::BFloat16": 2,
    "int": 4, "unsigned": 4, "unsigned int": 4, "int32_t": 4, "uint32_t": 4, "float": 4,
    "long": 8, "unsigned long": 8, "long long": 8, "unsigned long long": 8, "int64_t": 8, "uint64_t": 8,
    "size_t": 8, "double": 8, "void*": 8, "float2": 8, "float4": 16, "int4": 16, "uint4": 16,
    "__half2": 4, "half2": 4, "__nv_bfloat162": 4,
}
# Python factories whose positional arguments are all dimensions, and the
# element size of their default dtype (float32). Not torch.full (its second
# positional is the fill value) nor empty_strided (the stride).
DIMENSION_FACTORIES: dict[str, int] = {
    "torch.empty": 4, "torch.zeros": 4, "torch.ones": 4, "torch.rand": 4, "torch.randn": 4,
}
NATIVE_BYTE_APIS = frozenset({
    "cudaMalloc", "cudaMallocAsync", "cudaMallocHost", "cudaHostAlloc", "cudaMallocManaged", "cudaMallocFromPoolAsync",
    "cuMemAlloc", "cuMemAlloc_v2", "cuMemAllocHost", "cuMemHostAlloc", "cuMemAllocManaged", "cuMemAllocAsync",
    "cuMemCreate", "cuMemAddressReserve", "c10::cuda::CUDACachingAllocator::raw_alloc", "nvshmem_malloc",
    "nvshmem_align",
})
_INT_SUFFIX = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)(?:[uU](?:ll|LL|l|L)?|(?:ll|LL|l|L)[uU]?)\b")
_SIZEOF = re.compile(r"sizeof\s*\(\s*([A-Za-z_][\w:]*(?:\s+[A-Za-z_]\w*)*\s*\*?)\s*\)")
_CASTS = re.compile(r"\b(?:static_cast|reinterpret_cast)\s*<\s*[\w:]+\s*>")


def estimate_bytes(site: Site, bindings: tuple[tuple[str, int], ...]) -> int | None:
    """Bytes the site allocates, or None when that is not known statically.
    ``bindings`` are (name, value) pairs, sorted (the memo key of ``evaluate``)."""
    if site.via is not None or site.kind in (SiteKind.RELEASE, SiteKind.GRAPH_POOL):
        return None
    if site.language is Language.PYTHON:
        default = DIMENSION_FACTORIES.get(site.api)
        if default is None or not site.shape:
            return None
        element: int | None = default
        if site.dtype:
            # a known dtype, or a dtype expression the user bound to its element size
            element = dtype_bytes(site.dtype) or evaluate(site.dtype, bindings)
        if not element or element < 0:
            return None
        numel = 1
        for dim in site.shape:
            value = evaluate(dim, bindings)
            if value is None or value < 0:
                return None
            numel *= value
        return numel * element
    if site.api not in NATIVE_BYTE_APIS or site.size is None:
        return None
    value = evaluate(_native(site.size), bindings)
    return value if value is not None and value >= 0 else None


def dtype_bytes(dtype: str) -> int | None:
    """Element size of ``torch.bfloat16``, ``torch.float`` ...; None for an
    expression such as ``config.dtype``."""
    head, _, name = dtype.rpartition(".")
    return DTYPE_BYTES.get(name) if head in ("torch", "") else None


def human(n: int) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal, as memory reviews write them."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_binding(text: str) -> tuple[str, int]:
    """``NAME=VALUE`` -> (NAME, int); ValueError with what is wrong."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        raise ValueError(f"expected NAME=INTEGER, got {text!r}")
    try:
        number = int(value.strip().replace("_", ""), 0)
    except ValueError:
        raise ValueError(f"{name}: {value.strip()!r} is not an integer") from None
    return name, number


def _native(text: str) -> str:
    text = _CASTS.sub("", text)
    text = _INT_SUFFIX.sub(r"\1", text)

    def size_of(match: re.Match[str]) -> str:
        name = " ".join(match.group(1).split()).replace(" *", "*")
        return str(SIZEOF[name]) if name in SIZEOF else "__unknown__()"

    return _SIZEOF.sub(size_of, text)


@lru_cache(maxsize=8192)
def evaluate(text: str, bindings: tuple[tuple[str, int], ...]) -> int | None:
    """An integer expression of literals and bound names; None otherwise."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    values = dict(bindings)
    try:
        result = _eval(tree.body, values)
    except (ArithmeticError, ValueError, OverflowError):
        return None
    return result if result is None or result < 1 << 62 else None


def _eval(node: ast.expr, values: dict[str, int]) -> int | None:
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, int) and not isinstance(node.value, bool) else None
    if isinstance(node, (ast.Name, ast.Attribute)):
        dotted = _dotted(node)
        if dotted is None:
            return None
        if dotted in values:
            return values[dotted]
        return values.get(dotted.rsplit(".", 1)[-1])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _eval(node.operand, values)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, values), _eval(node.right, values)
        if left is None or right is None:
            return None
        op = node.op
        if isinstance(op, ast.Add):
            return left + right
        if isinstance(op, ast.Sub):
            return left - right
        if isinstance(op, ast.Mult):
            return left * right
        if isinstance(op, (ast.FloorDiv, ast.Div)):
            return left // right
        if isinstance(op, ast.Mod):
            return left % right
        if isinstance(op, ast.LShift) and 0 <= right < 63:
            return left << right
        if isinstance(op, ast.RShift) and 0 <= right < 63:
            return left >> right
        if isinstance(op, ast.Pow) and 0 <= right < 64:
            return left ** right if abs(left) < 2 ** 16 else None
        return None
    return None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None
