"""Allocations that hold no memory because they run on meta tensors: the
body of a function registered only for the Meta dispatch key (the C++ twin
of Python's ``register_fake``, ``python_fake.py``):
``TORCH_LIBRARY_IMPL(ns, Meta, m) { m.impl("op", TORCH_FN(f)); }`` (also
``STABLE_TORCH_LIBRARY_IMPL``, ``&f`` or a bare ``f``) or
``m.impl("op", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(f)))``. A
function also registered for another key (CUDA, CPU,
CompositeExplicitAutograd) runs on real tensors and keeps its sites. Part
of the C++ extractor (``cpp.py``). Pure: bytes -> names."""

from __future__ import annotations

import re

_WORD = b"Meta"
_IMPL_BLOCK = re.compile(rb"\b(?:STABLE_)?TORCH_LIBRARY_IMPL\s*\(\s*\w+\s*,\s*(\w+)\s*,\s*\w+\s*\)\s*\{")
_DISPATCH = re.compile(rb"(?:torch::)?dispatch\s*\(\s*(?:c10::|at::)?(?:DispatchKey::)?(\w+)\s*,")
# the function handed to `m.impl("op", ...)`: `TORCH_FN(f)`, `&f`, `f`
_IMPL_FN = re.compile(rb"\.impl\s*\(\s*(?:TORCH_SELECTIVE_NAME\s*\()?\s*\"[^\"]*\"\s*\)?\s*,\s*"
                      rb"(?:TORCH_BOX\s*\(|TORCH_FN\s*\(|&)?\s*([A-Za-z_][\w:]*)")
_FN = re.compile(rb"\s*(?:TORCH_BOX\s*\(|TORCH_FN\s*\(|&)?\s*([A-Za-z_][\w:]*)")


def meta_only_functions(source: bytes) -> frozenset[str]:
    """Names (last component) of functions registered for the Meta key and
    for no other key in this file."""
    if _WORD not in source:
        return frozenset()
    meta: set[str] = set()
    other: set[str] = set()
    for block in _IMPL_BLOCK.finditer(source):
        body = source[block.end():_block_end(source, block.end())]
        names = {m.group(1).decode().rsplit("::", 1)[-1] for m in _IMPL_FN.finditer(body)}
        (meta if block.group(1) == b"Meta" else other).update(names)
    for hit in _DISPATCH.finditer(source):
        fn = _FN.match(source, hit.end())
        if fn is not None:
            name = fn.group(1).decode().rsplit("::", 1)[-1]
            (meta if hit.group(1) == b"Meta" else other).add(name)
    return frozenset(meta - other)


def _block_end(source: bytes, start: int) -> int:
    depth = 1
    for i in range(start, min(len(source), start + 20000)):
        ch = source[i:i + 1]
        if ch == b"{":
            depth += 1
        elif ch == b"}":
            depth -= 1
            if depth == 0:
                return i
    return min(len(source), start + 20000)
