"""Stage 1b, pre-filter: decide from a file's bytes whether it must be
parsed. Compiled once from the API catalogues and the rule pack.

A file is parsed only when it contains one of these byte strings. Every
catalogue API contributes its last name component followed by "(" (Python
formatters never put a space there) and, for Python, followed by " as " (an
aliased import such as `from torch import empty as E`); rule-pack names
contribute the longest literal run of their glob. So a file without any of
them cannot hold a site or a rule trigger, and adding an API to a catalogue
can never make the filter skip the files that use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model import Language

if TYPE_CHECKING:
    from ..catalog import ApiCatalog
    from ..pack import RulePack

Needle = tuple[bytes, tuple[bytes, ...]]  # (gate, alternatives): see _needles


@dataclass(frozen=True)
class Prefilter:
    py_needles: tuple[Needle, ...]
    py_aliasable: frozenset[bytes]
    cpp_needles: tuple[Needle, ...]

    def passes(self, data: bytes, language: Language) -> bool:
        if language is Language.PYTHON:
            return passes_prefilter(data, self.py_needles, self.py_aliasable)
        return passes_prefilter(data, self.cpp_needles)


def compile_prefilter(apis: ApiCatalog, pack: RulePack) -> Prefilter:
    return Prefilter(_needles(_py_needles(apis, pack)), _py_aliasable(apis), _needles(_cpp_needles(apis, pack)))


def _literal(glob: str) -> str:
    """The longest identifier-like literal run of a glob."""
    runs = re.findall(r"[A-Za-z0-9_]+", glob.replace("*", " ").replace("?", " "))
    return max(runs, key=len) if runs else ""


def _trigger_needles(pack: RulePack) -> set[tuple[str, ...]]:
    """Every rule's triggers (``Rule.triggers``). Scratch accessors are not
    needles: alloc-bypasses-plan needs a direct allocation in the same
    function, whose own needle passes the file."""
    from ..rules import ALL_RULES

    needles: set[tuple[str, ...]] = set()
    for rule in ALL_RULES:
        triggers = rule.triggers(pack)
        for name in triggers.called:
            leaf = re.split(r"\.|::", name)[-1]
            if "*" not in leaf and "?" not in leaf:
                needles.add((f"{leaf}(",))
            elif len(_literal(name)) >= 4:
                needles.add((_literal(name),))
        # decorators and attributes are not called
        needles |= {(re.split(r"\.|::", n)[-1],) for n in triggers.named}
    return needles


def _py_needles(apis: ApiCatalog, pack: RulePack) -> set[tuple[str, ...]]:
    needles: set[tuple[str, ...]] = set()
    for name in apis.py_names:
        # the module must be imported too (`import cupy as cp` still says cupy)
        needles.add((name.partition(".")[0], f"{name.rsplit('.', 1)[-1]}("))
    needles |= {(f"{leaf}(",) for leaf in (*apis.py_leaf, *apis.py_exports)}
    # a ctypes function table: `self.funcs["cudaMalloc"](...)`
    needles |= {(f"{leaf}{q}]",) for leaf in apis.py_leaf for q in "\"'"}
    needles |= {(f".{m}(",) for m in apis.py_methods if m != "to"}
    # default-device contexts (a file that enters one decides where the
    # factories without a device that it calls allocate)
    needles |= {(f"{c}(",) for c in apis.py_device_contexts} | {("set_default_device(",)}
    # `Tensor.to(...)` and `device=...` name a CUDA device literally, and
    # `pin_memory=` is a keyword.
    needles |= {('"cuda',), ("'cuda",), ("current_device(",), ("pin_memory",)}
    return needles | _trigger_needles(pack)


def _py_aliasable(apis: ApiCatalog) -> frozenset[bytes]:
    """Names that an aliased import (`from torch import empty as E`) can hide."""
    leaves = {n.rsplit(".", 1)[-1] for n in apis.py_names} | set(apis.py_leaf) | set(apis.py_exports)
    return frozenset(leaf.encode() for leaf in leaves)


def _cpp_needles(apis: ApiCatalog, pack: RulePack) -> set[tuple[str, ...]]:
    needles: set[tuple[str, ...]] = set()
    for name in apis.cpp_names:
        leaf = name.rsplit("::", 1)[-1]
        needles.add((f"::{leaf}",) if "::" in name else (leaf,))
    # a type is matched by its last two components at least (`cuda::vector`
    # for `thrust::cuda::vector`, never a bare `vector`): so is the needle
    needles |= {("::".join(n.split("::")[-2:]),) for n in apis.cpp_types}
    needles |= {(f"{m}(",) for m in apis.cpp_methods} | {(n,) for n in apis.cpp_exports}
    return needles | _trigger_needles(pack)


def _needles(groups: Iterable[tuple[str, ...]]) -> tuple[Needle, ...]:
    """Needles as (gate, alternatives): a file passes when it contains the
    gate (if any) and one of the alternatives. Single-string needles share
    one gate-less group; pairs (module, name) are grouped by module, so a
    module the file never mentions costs one search, not one per name.
    Strings that contain a shorter alternative of the same group are dropped
    (the shorter one finds them too)."""
    by_gate: dict[str, set[str]] = {}
    for group in groups:
        gate, word = (group[0], group[1]) if len(group) == 2 else ("", group[0])
        by_gate.setdefault(gate, set()).add(word)
    # Gate-less words that share a prefix (`cuMemAlloc(`, `cuMemFree(`, ...)
    # are gated by it: a file without `cuMem` costs one search, not twelve.
    # The prefix is part of every word, so nothing the words find is lost.
    loose = by_gate.get("", set())
    by_prefix: dict[str, set[str]] = {}
    for word in loose:
        if len(word) > _PREFIX:
            by_prefix.setdefault(word[:_PREFIX], set()).add(word)
    for words in by_prefix.values():
        if len(words) >= 3:
            loose -= words
            by_gate.setdefault(_common_prefix(words), set()).update(words)
    out: list[Needle] = []
    for gate in sorted(by_gate, key=lambda g: (g != "", g)):
        kept: list[str] = []
        for word in sorted(by_gate[gate], key=lambda w: (len(w), w)):
            if not any(k in word for k in kept):
                kept.append(word)
        out.append((gate.encode(), tuple(w.encode() for w in kept)))
    return tuple(out)


_PREFIX = 4


def _common_prefix(words: Iterable[str]) -> str:
    first, *rest = sorted(words)
    last = rest[-1] if rest else first
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


_ALIAS_IMPORT = re.compile(rb"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import[ \t][^\n]*\bas\b[^\n]*", re.M)
_WORD = re.compile(rb"\w+")


def passes_prefilter(data: bytes, needles: tuple[Needle, ...], aliasable: frozenset[bytes] = frozenset()) -> bool:
    """True when ``data`` may hold a site or a rule trigger (see above)."""
    for gate, alternatives in needles:
        if gate and gate not in data:
            continue
        for word in alternatives:
            if word in data:
                return True
    if aliasable and b" as " in data:
        for line in _ALIAS_IMPORT.findall(data):
            if not aliasable.isdisjoint(_WORD.findall(line)):
                return True
    return False
