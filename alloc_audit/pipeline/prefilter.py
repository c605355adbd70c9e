"""Stage 1b, pre-filter: decide from a file's bytes whether it must be
parsed. Compiled once from the API catalogues and the rule pack.

A file is parsed only when it contains one of these byte strings. Every
catalogue API contributes its last name component followed by "(" (Python
formatters never put a space there) and, for Python, followed by " as " (an
aliased import such as `from torch import empty as E`); rule-pack names
contribute the longest literal run of their glob; a checkpoint reader
(the catalogue's `loader` entries, a site only where its placement keyword
is given) contributes that keyword. So a file without any of
them cannot hold a site or a rule trigger, and adding an API to a catalogue
can never make the filter skip the files that use it.

`.to(` is no needle (nearly every torch file says it); a Python file passes
for a move only when a `.to(` names a device (``moves_to_device``: `.to(device)`,
`.to(self.dev)`, `.to(0)`), as the extractor's device copies do (issue 11,
round 18: such a file was parsed only when it happened to name a factory).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model import Language
from .parse_macros import literal_led

if TYPE_CHECKING:
    from ..catalog import ApiCatalog
    from ..pack import RulePack

Needle = tuple[bytes, tuple[bytes, ...]]  # (gate, alternatives): see _needles
# a needle with the probes it must pass first (see ``screen_prefilter``):
# (gate, its probes, ((word, its probes), ...)); each as Probes
Probes = tuple[tuple[bytes, ...], tuple[bytes, ...]]  # (probes a literal's identifier cannot hold, those it can)
Probed = tuple[bytes, Probes, tuple[tuple[bytes, Probes], ...]]


@dataclass(frozen=True)
class Prefilter:
    py_needles: tuple[Needle, ...]
    py_aliasable: frozenset[bytes]
    cpp_needles: tuple[Needle, ...]
    py_probed: tuple[Probed, ...] = ()
    cpp_probed: tuple[Probed, ...] = ()
    py_quick: tuple[Needle, ...] = ()  # a few of ``py_needles`` that most files that pass hold (``_QUICK``)

    def passes(self, data: bytes, language: Language) -> bool:
        if language is Language.PYTHON:
            return passes_prefilter(data, self.py_needles, self.py_aliasable, moves=True)
        return passes_prefilter(data, self.cpp_needles)

    def screen(self, data: bytes, language: Language) -> str | None:
        """None when the file must be parsed (``passes``); else the
        identifiers it mentions (``expand.identifiers``: one text), which the
        expansion asks of a skipped file. One pass over the bytes serves
        both: the identifiers are found first, and each needle is looked for
        in the file only when they show it can be there. A Python file that
        holds one of a few common needles (``py_quick``) passes at once."""
        python = language is Language.PYTHON
        if python and passes_prefilter(data, self.py_quick):
            return None  # a needle found at once: passes, and a file that passes needs no identifiers
        return screen_prefilter(data, self.py_probed if python else self.cpp_probed,
                                self.py_aliasable if python else frozenset(), moves=python)


def compile_prefilter(apis: ApiCatalog, pack: RulePack) -> Prefilter:
    py, cpp = _needles(_py_needles(apis, pack)), _needles(_cpp_needles(apis, pack))
    return Prefilter(py, _py_aliasable(apis), cpp, _probed(py), _probed(cpp), _quick(py))


# The needles most Python files that pass hold (one of them in 94 % of those of flashinfer, 81 % of
# aphrodite): looked for first, each a search of the bytes, they pass such a file without finding its
# identifiers (screen_prefilter's first and largest cost). Each is a needle of the catalogue or none is
# used: a file passes on them only where ``passes_prefilter`` passes it.
_QUICK = frozenset({b'"cuda', b"empty(", b"tensor(", b"zeros("})


def _quick(needles: tuple[Needle, ...]) -> tuple[Needle, ...]:
    picked = ((gate, tuple(w for w in words if w in _QUICK)) for gate, words in needles)
    return tuple((gate, words) for gate, words in picked if words)


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
    for name, spec in apis.py_names.items():
        # the module must be imported too (`import cupy as cp` still says cupy);
        # a checkpoint reader makes a site only where its placement keyword is
        # given (`torch.load(f, map_location=dev)`): the keyword is its word
        word = spec.device_keyword if spec.device == "loader" else f"{name.rsplit('.', 1)[-1]}("
        needles.add((name.partition(".")[0], word))
    needles |= {(f"{leaf}(",) for leaf in (*apis.py_leaf, *apis.py_exports)}
    # a ctypes function table: `self.funcs["cudaMalloc"](...)`
    needles |= {(f"{leaf}{q}]",) for leaf in apis.py_leaf for q in "\"'"}
    needles |= {(f".{m}(",) for m in apis.py_methods if m != "to"}
    # default-device contexts (a file that enters one decides where the
    # factories without a device that it calls allocate)
    needles |= {(f"{c}(",) for c in apis.py_device_contexts} | {("set_default_device(",), ("set_default_tensor_type(",)}
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


def _probed(needles: tuple[Needle, ...]) -> tuple[Probed, ...]:
    return tuple((gate, _split(probes(gate)), tuple((word, _split(probes(word))) for word in words))
                 for gate, words in needles)


def _split(found: tuple[bytes, ...]) -> Probes:
    """Probes that no hex literal's identifier can hold (``0x7f00ULL`` ->
    ``x7f00ULL``), and those that one can (``full``: ``0x0full``)."""
    literal = tuple(p for p in found if _LITERAL_PART.fullmatch(p.strip(b" ")))
    return tuple(p for p in found if p not in literal), literal


def probes(word: bytes) -> tuple[bytes, ...]:
    """What the identifiers of a file that holds ``word`` must show, as
    substrings of those identifiers joined by spaces (``_joined``): each
    identifier run of the word, with a space on the side where the word goes
    on past it. ``empty(`` -> ``b"empty "``: some identifier ends with
    ``empty``; ``.new_empty(`` -> ``b" new_empty "``: one is ``new_empty``;
    ``cuMem`` -> ``b"cuMem"``: one contains it. Runs that an identifier need
    not show (shorter than 3 bytes, or starting with a digit) are left out."""
    out: list[bytes] = []
    for m in _RUN.finditer(word):
        run = m.group(0)
        if len(run) < 3 or run[:1].isdigit():
            continue
        out.append((b" " if m.start() > 0 else b"") + run + (b" " if m.end() < len(word) else b""))
    return tuple(out)


# Identifiers as the expansion knows a skipped file (3 bytes or more: every
# maximal run of [A-Za-z0-9_], less its leading digits). In a file holding a
# needle, each identifier run of the needle is part of one of them, so
# looking for the probes in the file's identifiers (a fraction of its bytes,
# each name once) rules most needles out without a search of the file.
_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{2,}")
_RUN = re.compile(rb"[A-Za-z0-9_]+")
# Files of embedded binaries (`0x7472747368732e00ULL, ...`) mention a million
# such identifiers; the probes that none of them can hold are looked for in
# the identifiers without them. _LITERAL_PART: any part of one.
_LITERALS = re.compile(rb" [xX][0-9a-fA-F]*[uUlL]*(?= )")
_LITERAL_PART = re.compile(rb"[xX]?[0-9a-fA-F]*[uUlL]*")
_LITERALS_FROM = 1 << 16  # bytes of identifiers: below, not worth a pass


def screen_prefilter(data: bytes, probed: tuple[Probed, ...], aliasable: frozenset[bytes] = frozenset(),
                     moves: bool = False) -> str | None:
    """``passes_prefilter`` and, for a file it skips, its identifiers
    (``expand.identifiers``' text): None when the file passes. The probes only rule needles out;
    a needle they leave is looked for in the file itself, so the answer is
    ``passes_prefilter``'s (tests/test_prefilter.py compares the two)."""
    found = dict.fromkeys(_IDENTIFIER.findall(data))  # each once, in the order of first mention
    joined = b" " + b" ".join(found) + b" "
    clean = _LITERALS.sub(b"", joined) if len(joined) > _LITERALS_FROM else joined
    for gate, (gate_clean, gate_any), words in probed:
        if gate:
            if not all(p in clean for p in gate_clean) or not all(p in joined for p in gate_any) \
                    or gate not in data:
                continue
        for word, (word_clean, word_any) in words:
            for p in word_clean:
                if p not in clean:
                    break
            else:
                for p in word_any:
                    if p not in joined:
                        break
                else:
                    if word in data:
                        return None
    # an aliased import of an aliasable name: the name is one of the
    # identifiers (each is 3 bytes or more and starts with a letter)
    if aliasable and b" as " in data and (not aliasable.isdisjoint(found) or not _all_identifiers(aliasable)):
        for line in _alias_imports(data):
            if not aliasable.isdisjoint(_WORD.findall(line)):
                return None
    if moves and moves_to_device(data):
        return None
    # ``joined`` is ``expand.identifiers``' text: every identifier once, between single spaces, in the
    # order of first mention. One string, not a string per name (round 35: the names were split, sorted
    # and interned one by one, ~1.2 CPU s of aphrodite's 1.4 M names; the probes above are order-free)
    return joined.decode("ascii")


@functools.cache
def _all_identifiers(names: frozenset[bytes]) -> bool:
    return all(_IDENTIFIER.fullmatch(n) for n in names)


_ALIAS_IMPORT = re.compile(rb"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import[ \t][^\n]*\bas\b[^\n]*", re.M)
_WORD = re.compile(rb"\w+")


def _alias_imports(data: bytes) -> list[bytes]:
    """``_ALIAS_IMPORT.findall(data)``, tried only at the start of a line
    that says ``import`` (a match is one line that holds it; ``re`` tries a
    pattern that begins with ``^`` at every byte: round 34, flashinfer's
    skipped Python files 0.11 CPU s)."""
    return [m.group(0) for m in literal_led(_ALIAS_IMPORT, data, b"import", "line")]


def passes_prefilter(data: bytes, needles: tuple[Needle, ...], aliasable: frozenset[bytes] = frozenset(),
                     moves: bool = False) -> bool:
    """True when ``data`` may hold a site or a rule trigger (see above);
    with ``moves`` (Python), a copy to a device too."""
    for gate, alternatives in needles:
        if gate and gate not in data:
            continue
        for word in alternatives:
            if word in data:
                return True
    if aliasable and b" as " in data:
        for line in _alias_imports(data):
            if not aliasable.isdisjoint(_WORD.findall(line)):
                return True
    return moves and moves_to_device(data)


# `.to(` whose arguments, up to the first `)`, say `dev` (`device`, `self.dev`,
# `x.device`, `device=dev`, `torch.device(`) or start with a GPU index: a
# superset of the copies the extractor takes for device sites (``_copy_device``)
_DEVICE_MOVE = re.compile(rb"\.to\(\s*(?:\d|[^)]{0,160}?dev)")


def moves_to_device(data: bytes) -> bool:
    """Whether a Python file may copy a tensor or a module to a device."""
    return b".to(" in data and _DEVICE_MOVE.search(data) is not None
