"""Allocations that hold no memory because they run on meta tensors: the
body of a function registered only for the Meta dispatch key (the C++ twin
of Python's ``register_fake``, ``python_fake.py``):
``TORCH_LIBRARY_IMPL(ns, Meta, m) { m.impl("op", TORCH_FN(f)); }`` (also
``STABLE_TORCH_LIBRARY_IMPL``, ``&f`` or a bare ``f``) or
``m.impl("op", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(f)))``. A
function also registered for another key (CUDA, CPU,
CompositeExplicitAutograd) runs on real tensors and keeps its sites. A
function registered only for host keys (CPU, QuantizedCPU, SparseCPU, and
Meta) runs on CPU tensors: an allocation whose device follows its inputs
(``x.options()``, ``empty_like(x)``) is on the host (``host_only_functions``).
Registration macros count with the key they name:
``DISPATCH_TO_CPU("op", f)``, ``FBGEMM_OP_DISPATCH(Meta, "op", f)`` (a
``*_DISPATCH`` macro given the key first), ``REGISTER_DEVICE_IMPL(impl,
CPU, f)``. Part of the C++ extractor (``cpp.py``). Pure: bytes -> names."""

from __future__ import annotations

import re

_WORDS = (b"Meta", b"CPU")
_IMPL_BLOCK = re.compile(rb"\b(?:STABLE_)?TORCH_LIBRARY_IMPL\s*\(\s*\w+\s*,\s*(\w+)\s*,\s*\w+\s*\)\s*\{")
_DISPATCH = re.compile(rb"(?:torch::)?dispatch\s*\(\s*(?:c10::|at::)?(?:DispatchKey::)?(\w+)\s*,")
# the function handed to `m.impl("op", ...)`: `TORCH_FN(f)`, `&f`, `f`
_IMPL_FN = re.compile(rb"\.impl\s*\(\s*(?:TORCH_SELECTIVE_NAME\s*\()?\s*\"[^\"]*\"\s*\)?\s*,\s*"
                      rb"(?:TORCH_BOX\s*\(|TORCH_FN\s*\(|&)?\s*([A-Za-z_][\w:]*)")
_FN = re.compile(rb"\s*(?:TORCH_BOX\s*\(|TORCH_FN\s*\(|&)?\s*([A-Za-z_][\w:]*)")
# `DISPATCH_TO_CPU("op", f)`, `FBGEMM_OP_DISPATCH(Meta, "op", f)`, `REGISTER_DEVICE_IMPL(impl, CPU, f)`
_MACRO = re.compile(rb"\bDISPATCH_TO_([A-Z_]+)\s*\(\s*\"[^\"]*\"\s*,"
                    rb"|\b[A-Z]\w*_DISPATCH\s*\(\s*(\w+)\s*,\s*\"[^\"]*\"\s*,"
                    rb"|\bREGISTER_DEVICE_IMPL\s*\(\s*\w+\s*,\s*(\w+)\s*,")
_MACRO_KEYS = {b"META": b"Meta", b"QUANTIZED_CPU": b"QuantizedCPU", b"SPARSE_CPU": b"SparseCPU"}
_HOST_KEYS = frozenset({b"CPU", b"QuantizedCPU", b"SparseCPU", b"Meta"})


def meta_and_host_functions(source: bytes) -> tuple[frozenset[str], frozenset[str]]:
    """Names (last component) of functions registered in this file for the
    Meta key and no other, and for a host key (CPU, ...) and no device key."""
    keys = registered_keys(source)
    meta = frozenset(name for name, k in keys.items() if k == {b"Meta"})
    return meta, frozenset(name for name, k in keys.items() if k <= _HOST_KEYS and name not in meta)


def registered_keys(source: bytes) -> dict[str, set[bytes]]:
    """The dispatch keys each function of this file is registered for."""
    keys: dict[str, set[bytes]] = {}
    if not any(word in source for word in _WORDS):
        return keys
    # each pattern begins with `\b` or an optional group, which `re` tries at every byte: looked for only
    # in a file that holds the word every match holds (round 34)
    for block in _IMPL_BLOCK.finditer(source) if b"TORCH_LIBRARY_IMPL" in source else ():
        body = source[block.end():_block_end(source, block.end())]
        for m in _IMPL_FN.finditer(body):
            keys.setdefault(m.group(1).decode().rsplit("::", 1)[-1], set()).add(block.group(1))
    for hit in _DISPATCH.finditer(source) if b"dispatch" in source else ():
        fn = _FN.match(source, hit.end())
        if fn is not None:
            keys.setdefault(fn.group(1).decode().rsplit("::", 1)[-1], set()).add(hit.group(1))
    if b"DISPATCH" in source or b"REGISTER_DEVICE_IMPL" in source:
        for hit in _MACRO.finditer(source):
            fn = _FN.match(source, hit.end())
            if fn is not None:
                key = hit.group(1) or hit.group(2) or hit.group(3)
                keys.setdefault(fn.group(1).decode().rsplit("::", 1)[-1], set()).add(_MACRO_KEYS.get(key, key))
    return keys


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
