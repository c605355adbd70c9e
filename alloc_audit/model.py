"""The frozen facts every stage shares.

Facts are small, immutable and serialisable: strings, numbers, enums and
tuples, never tree-sitter nodes (DESIGN.md, "extract facts"); the cache
stores them in the positional form of ``pipeline/serial.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from .slots import builder


class Language(str, Enum):
    PYTHON = "python"
    CPP = "cpp"
    CUDA = "cuda"


class SiteKind(str, Enum):
    DEVICE = "device"
    PINNED_HOST = "pinned-host"
    MANAGED = "managed"
    IPC = "ipc"
    VIRTUAL = "virtual"
    GRAPH_POOL = "graph-pool"
    WORKSPACE = "workspace"
    RELEASE = "release"


class Tier(str, Enum):
    T1 = "T1"
    T2 = "T2"
    T3 = "T3"
    T4 = "T4"
    T5A = "T5a"
    T5B = "T5b"
    UNKNOWN = "unknown"


TIER_ORDER = tuple(Tier)  # T1 .. T5b, unknown: the order of every table
TIER_VALUES = tuple(t.value for t in Tier)  # as written in configs, annotations and the allowlist
ASSIGNABLE_TIERS = tuple(t.value for t in Tier if t is not Tier.UNKNOWN)  # what an override may set

TIER_NAMES = {
    Tier.T1: "model-resident",
    Tier.T2: "engine-persistent",
    Tier.T3: "pooled",
    Tier.T4: "forward-scratch",
    Tier.T5A: "host-staging",
    Tier.T5B: "host-pinned",
    Tier.UNKNOWN: "unknown",
}


# Code roles (DESIGN.md "Code roles"): what a file is, from path conventions
# (pipeline/roles.py); reports list production first.
PRODUCTION, TEST, BENCHMARK, EXAMPLE, TOOLING = "production", "test", "benchmark", "example", "tooling"
ROLES = (PRODUCTION, TEST, BENCHMARK, EXAMPLE, TOOLING)
ROLE_ORDER = {role: i for i, role in enumerate(ROLES)}


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"  # shown, never fails by default: findings in test/benchmark code, tiny cases


class FailOn(str, Enum):
    """The lowest severity of an open finding that fails a command (exit 1)."""

    NEVER = "never"
    WARNING = "warning"
    ERROR = "error"

    def fails(self, severity: Severity) -> bool:
        if self is FailOn.NEVER or severity is Severity.INFO:
            return False
        return severity is Severity.ERROR or self is FailOn.WARNING


@dataclass(frozen=True, slots=True)
class Span:
    """1-based lines and columns; ``end_col`` is exclusive."""

    line: int
    col: int
    end_line: int
    end_col: int

    def contains(self, other: Span) -> bool:
        return (self.line, self.col) <= (other.line, other.col) and (other.end_line, other.end_col) <= (
            self.end_line,
            self.end_col,
        )

    def contains_line(self, line: int) -> bool:
        return self.line <= line <= self.end_line


@dataclass(frozen=True, slots=True)
class Arg:
    """One call argument: its keyword (None when positional) and source text."""

    keyword: str | None
    text: str


@dataclass(frozen=True, slots=True)
class Via:
    """Where a derived site's memory is really acquired."""

    api: str
    path: str
    line: int


@dataclass(frozen=True, slots=True)
class Site:
    """An allocation (or, in native code, a release) found in the source.

    ``shape`` keeps the size argument's structure (one entry per dimension or
    byte-count argument) so byte sizing can evaluate it later; ``size`` is the
    verbatim text. ``target`` is what receives the memory (``self.buf``,
    ``buf_`` from ``cudaMalloc(&buf_, n)``) when it can be told; ``wrapper``
    the call the allocation is handed to directly (``nn.Parameter``,
    ``self.register_buffer``), which says a lot about its lifetime.
    """

    path: str
    span: Span
    language: Language
    api: str
    kind: SiteKind
    scope: str
    size: str | None = None
    shape: tuple[str, ...] = ()
    dtype: str | None = None
    device: str | None = None
    target: str | None = None
    wrapper: str | None = None
    stmt_line: int = 0
    recovered: bool = False  # inside a region the parser had to recover from a syntax error
    # where the memory goes: "self.x", "self.pool[]", "return", "handed:f", "static", "local"; "" unknown
    kept: str = ""
    # no device given, but under a default-device context: which one, and how it is reached
    device_context: str = ""
    tier: Tier = Tier.UNKNOWN
    tier_reason: str = ""
    via: Via | None = None
    role: str = "production"  # code role of the file (roles.py): production, test, benchmark, example, tooling

    @property
    def derived(self) -> bool:
        return self.via is not None

    @property
    def acquires(self) -> bool:
        """An acquisition, not a release: what the allowlist holds (derived sites included)."""
        return self.kind is not SiteKind.RELEASE

    @property
    def counted(self) -> bool:
        """What a census counts: a direct acquisition. Derived sites are counted
        apart so that totals never count one allocation twice (DESIGN.md)."""
        return self.via is None and self.kind is not SiteKind.RELEASE

    @property
    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.path, self.span.line, self.span.col, self.api)


@dataclass(frozen=True, slots=True)
class Scope:
    """A function, method, lambda or class definition.

    ``qualname`` joins enclosing names with ``.`` (Python) or ``::`` (C++);
    ``owner`` is the qualified name of the innermost enclosing class, if any.
    ``role`` is one of module, class, function, method, constructor,
    destructor, lambda.
    """

    qualname: str
    name: str
    kind: str
    role: str
    span: Span
    owner: str | None = None
    params: tuple[str, ...] = ()
    param_types: tuple[str, ...] = ()
    param_defaults: tuple[str, ...] = ()  # each parameter's default's source text, "" for none (Python)
    # native functions: one letter per parameter, ``p`` a pointer (a `*`/`[]` declarator, `nullptr_t`, a smart
    # pointer), ``n`` a number or enum-free builtin (`int`, `size_t`, `float`, ...: no pointer converts to it),
    # ``o`` anything else; ``.`` last when a variadic parameter (`...`, `Args&&... args`) follows
    param_kinds: str = ""
    decorators: tuple[str, ...] = ()
    bases: tuple[str, ...] = ()
    yields: tuple[int, ...] = ()
    doc: str = ""
    returns_type: str | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """A call expression. ``callee`` is the dotted/qualified callee text with
    Python import aliases resolved; ``arglist`` the source text between the
    parentheses (split on demand by ``arglists.split_args``: most calls are
    never looked at twice); ``target`` the assignment target the call's
    value is stored to, when the call is the whole right-hand side."""

    scope: str
    span: Span
    callee: str
    arglist: str = ""
    target: str | None = None


@dataclass(frozen=True, slots=True)
class CallTable:
    """A file's calls, stored by column. A file has thousands of calls and
    most are only ever looked at by name, so they are kept as parallel
    tuples (cheap to cache, send between processes and load) and turned into
    ``Call`` objects only when asked for (``table[i]``, iteration).
    ``positions`` holds line, col, end_line, end_col for each call, flat."""

    scopes: tuple[str, ...] = ()
    callees: tuple[str, ...] = ()
    arglists: tuple[str, ...] = ()
    targets: tuple[str | None, ...] = ()
    positions: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.callees)

    def __getitem__(self, i: int) -> Call:
        p = self.positions
        k = 4 * i
        return _call(self.scopes[i], _span(p[k], p[k + 1], p[k + 2], p[k + 3]), self.callees[i], self.arglists[i],
                     self.targets[i])

    def __iter__(self) -> Iterator[Call]:
        return (self[i] for i in range(len(self.callees)))

    def line(self, i: int) -> int:
        return self.positions[4 * i]

    @staticmethod
    def of(calls: Iterable[Call]) -> CallTable:
        items = sorted(calls, key=lambda c: (c.span.line, c.span.col, c.span.end_line, c.span.end_col))
        positions: list[int] = []
        for c in items:
            positions += (c.span.line, c.span.col, c.span.end_line, c.span.end_col)
        return CallTable(tuple(c.scope for c in items), tuple(c.callee for c in items),
                         tuple(c.arglist for c in items), tuple(c.target for c in items), tuple(positions))


_call, _span = builder(Call), builder(Span)  # `Call(...)`, `Span(...)` through the slots (`slots.builder`)


@dataclass(frozen=True, slots=True)
class Assign:
    """An assignment, declaration with initialiser, ``del`` (op ``del``) or
    augmented assignment. ``targets`` are source texts; ``type`` is the
    declared type in C++ or an annotation in Python."""

    scope: str
    line: int
    targets: tuple[str, ...]
    value: str
    op: str = "="
    type: str | None = None


@dataclass(frozen=True, slots=True)
class Return:
    scope: str
    line: int
    value: str


@dataclass(frozen=True, slots=True)
class Block:
    """A control-flow region: ``if``/``else`` branches, loops, ``try``,
    ``except`` and ``finally`` bodies. ``test`` is the branch condition;
    ``exits`` is true when the body ends the function's normal flow
    (return/raise/throw) so code after it runs only when the test was false
    (a guard clause). ``parent`` is the span of the enclosing statement, so
    sibling branches (if/else) can be told apart from nested ones."""

    kind: str
    scope: str
    span: Span
    test: str = ""
    exits: bool = False
    stmt: Span | None = None


@dataclass(frozen=True, slots=True)
class WithItem:
    callee: str
    args: tuple[Arg, ...]
    target: str | None


@dataclass(frozen=True, slots=True)
class With:
    """A ``with`` statement: its context items and the span of its body."""

    scope: str
    span: Span
    body: Span
    items: tuple[WithItem, ...]


@dataclass(frozen=True, slots=True)
class Import:
    """``name`` is bound in the file and refers to dotted ``target``."""

    name: str
    target: str
    line: int


@dataclass(frozen=True, slots=True)
class Field:
    """A C++ data member with its declared type (smart pointers unwrapped);
    ``held``: the member is an object of that type itself (no pointer,
    reference, array or smart pointer), built with each object."""

    owner: str
    name: str
    type: str
    held: bool = False


@dataclass(frozen=True, slots=True)
class Annotation:
    """An ``alloc-audit:`` comment. kind is ``ignore``, ``tier`` or
    ``invalid``. ``own_line`` is true when the comment is alone on its line;
    it then applies to the next code line, ``applies_to``. ``problem`` is set
    when it is malformed."""

    line: int
    kind: str
    rules: tuple[str, ...] = ()
    tier: str | None = None
    reason: str = ""
    own_line: bool = False
    problem: str = ""
    applies_to: int = 0  # own-line: the next line of code below it (comments and blank lines skipped)


@dataclass(frozen=True, slots=True)
class FileFacts:
    """Everything the later stages need to know about one file."""

    path: str
    language: Language
    digest: str
    module: str = ""
    parsed: bool = True
    errors: tuple[str, ...] = ()
    sites: tuple[Site, ...] = ()
    scopes: tuple[Scope, ...] = ()
    calls: CallTable = CallTable()
    assigns: tuple[Assign, ...] = ()
    returns: tuple[Return, ...] = ()
    blocks: tuple[Block, ...] = ()
    withs: tuple[With, ...] = ()
    default_sites: tuple[Site, ...] = ()  # factories without a device: sites only under a default-device context
    imports: tuple[Import, ...] = ()
    fields: tuple[Field, ...] = ()
    annotations: tuple[Annotation, ...] = ()
    lines_of_code: int = 0

    @property
    def partial(self) -> bool:
        return bool(self.errors)


@dataclass(frozen=True, slots=True)
class FileError:
    """A file we could not fully read or parse; the run goes on."""

    path: str
    message: str


@dataclass(frozen=True, slots=True)
class Related:
    path: str
    line: int
    note: str


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    severity: Severity
    path: str
    line: int
    col: int
    scope: str
    message: str
    related: tuple[Related, ...] = ()
    key: str = ""
    suppressed: str | None = None
    stmt_line: int = 0  # where the statement holding ``line`` starts (for suppressions)
    role: str = "production"  # code role of the finding's file (roles.py)

    @property
    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.path, self.line, self.col, self.rule)


# ---------------------------------------------------------------- the result of a scan


@dataclass(frozen=True)
class Stats:
    files: int
    parsed: int
    parse_errors: int
    seconds: float  # wall clock: the one value that differs between two runs
    lines: int = 0


@dataclass(frozen=True)
class ScanResult:
    """What a scan found: sites (direct and derived, sorted), findings,
    file problems, and which files it covered. ``files`` holds the parsed
    files' facts (empty when the result came from the cache)."""

    root: Path
    sites: tuple[Site, ...]
    findings: tuple[Finding, ...]
    errors: tuple[FileError, ...]
    stats: Stats
    files: dict[str, FileFacts] = field(default_factory=dict)
    scanned_paths: frozenset[str] = frozenset()
    # Files whose sites may be incomplete (over the size limit, unreadable,
    # an undecodable name, a parser or extractor failure), with the reason;
    # also listed in ``errors``. Their allowlist entries are "not checked":
    # never judged stale, never pruned (ratchet).
    unchecked: tuple[FileError, ...] = ()


_UNSAFE_IN_KEY = re.compile(r"[\s#%]")


def escape_key_field(text: str) -> str:
    """A key field with spaces, ``#``, ``%`` and control characters
    percent-encoded, so a key is always three tokens (ratchet/keys.py)."""
    return _UNSAFE_IN_KEY.sub(lambda m: "".join(f"%{b:02X}" for b in m.group(0).encode()), text)


def key_text(key: tuple[str, str, str]) -> str:
    """A ``(path, scope, api)`` key as the allowlist and findings write it."""
    return " ".join(escape_key_field(part) for part in key)


__all__ = [
    "ASSIGNABLE_TIERS",
    "TIER_NAMES",
    "TIER_ORDER",
    "TIER_VALUES",
    "Annotation",
    "Arg",
    "Assign",
    "Block",
    "Call",
    "CallTable",
    "FailOn",
    "Field",
    "FileError",
    "FileFacts",
    "Finding",
    "Import",
    "Language",
    "Related",
    "Return",
    "ScanResult",
    "Scope",
    "Severity",
    "Site",
    "SiteKind",
    "Stats",
    "Span",
    "Tier",
    "Via",
    "With",
    "WithItem",
    "escape_key_field",
    "key_text",
]
