"""What the Python and the C++/CUDA extractors share: spans with code-point
columns, capped texts, the sweep that gives every captured node its
innermost enclosing scope, annotation comments, statement lines, blocks
that end the flow, and IPC marking of exported sites. The language
differences are parameters (node type names, comment markers). Nothing here
keeps a node beyond the extraction of one file."""

from __future__ import annotations

import dataclasses
import re
from bisect import bisect_right
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cache
from operator import attrgetter
from typing import Any

from ...arglists import split_top_level
from ...model import Annotation, Block, Language, Site, SiteKind, Span
from .annotations import MARKER, next_code_line, parse_annotation

TEXT_CAP = 300


class Source:
    """The parsed bytes of one file: capped texts sliced from the buffer
    (``node.text`` would copy a whole function to read its first line) and
    spans with code-point columns. Columns need decoding only on a line with
    a non-ASCII byte before the node, found with one sorted offset list."""

    __slots__ = ("data", "ascii", "_wide", "_wide_rows")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.ascii = data.isascii()
        self._wide: list[int] | None = None
        self._wide_rows: frozenset[int] | None = None

    def wide_rows(self) -> frozenset[int]:
        """0-based rows that hold a non-ASCII byte: elsewhere a byte column
        is the code-point column."""
        if self._wide_rows is None:
            self._wide_rows = frozenset() if self.ascii else frozenset(
                i for i, line in enumerate(self.data.split(b"\n")) if not line.isascii())
        return self._wide_rows

    def col(self, byte_col: int, byte: int) -> int:
        """1-based code-point column of a byte position (tree-sitter gives bytes)."""
        if self.ascii:
            return byte_col + 1
        wide = self._wide
        if wide is None:
            wide = self._wide = [m.start() for m in _NON_ASCII.finditer(self.data)]
        line_start = byte - byte_col
        k = bisect_right(wide, byte - 1)
        if k == 0 or wide[k - 1] < line_start:
            return byte_col + 1
        return len(self.data[line_start:byte].decode("utf-8", "replace")) + 1

    def span(self, node: Any) -> Span:
        (r0, c0), (r1, c1) = node.start_point, node.end_point
        if self.ascii:
            return Span(r0 + 1, c0 + 1, r1 + 1, c1 + 1)
        return Span(r0 + 1, self.col(c0, node.start_byte), r1 + 1, self.col(c1, node.end_byte))

    def text(self, node: Any, cap: int = TEXT_CAP) -> str:
        """Node text, capped, with runs of whitespace collapsed."""
        start = node.start_byte
        raw = self.data[start:min(node.end_byte, start + cap)]
        if _SPACE_RUN.search(raw) is not None:
            return " ".join(raw.decode("utf-8", "replace").split())
        return raw.decode("utf-8", "replace")

    def raw(self, node: Any, cap: int = TEXT_CAP) -> str:
        start = node.start_byte
        return self.data[start:min(node.end_byte, start + cap)].decode("utf-8", "replace")

    def line_prefix_blank(self, node: Any) -> bool:
        """True when only whitespace precedes ``node`` on its line."""
        start = node.start_byte - node.start_point[1]
        return not self.data[start:node.start_byte].strip()


_NON_ASCII = re.compile(rb"[\x80-\xff]")
_SPACE_RUN = re.compile(rb"[\n\r\t]|  ")


class Containers:
    """Properly nested byte ranges ``(start, end)`` (scopes are): for any
    position, the innermost range holding it; for any range, its parent.
    Built by one stack sweep; iterative, so deep nesting is safe."""

    def __init__(self, ranges: Sequence[tuple[int, int]]) -> None:
        self.ranges = ranges
        self._order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], -ranges[i][1]))
        self._starts = [ranges[i][0] for i in self._order]
        self.parent: list[int] = [-1] * len(ranges)
        self._parent_k: list[int] = [-1] * len(ranges)
        stack: list[int] = []
        for k, i in enumerate(self._order):
            start = ranges[i][0]
            while stack and ranges[self._order[stack[-1]]][1] <= start:
                stack.pop()
            if stack:
                self._parent_k[k] = stack[-1]
                self.parent[i] = self._order[stack[-1]]
            stack.append(k)

    def innermost(self, pos: int) -> int:
        """Index of the innermost range with start <= pos < end, or -1."""
        k = bisect_right(self._starts, pos) - 1
        ranges, order = self.ranges, self._order
        while k >= 0 and ranges[order[k]][1] <= pos:
            k = self._parent_k[k]
        return order[k] if k >= 0 else -1


@cache
def field_ids(grammar: Language, *names: str) -> tuple[int, ...]:
    """The grammar's ids of the fields ``names``, in order:
    ``node.child_by_field_id(field_ids(g, n)[0])`` is
    ``node.child_by_field_name(n)``, which looks the name up among the
    grammar's field names on every call (round 34: a third of its cost in
    the extractor's loops over every assignment, scope and block)."""
    from ..parse import language

    lang = language(grammar)
    out = []
    for name in names:
        found = lang.field_id_for_name(name)
        if found is None:
            raise KeyError(name)
        out.append(found)
    return tuple(out)


_START = attrgetter("start_byte")
_END = attrgetter("end_byte")


def ordered_captures(query: Any, root: Any) -> dict[str, list[Any]]:
    """A query's captures by name, each list in document order (outer node
    first). py-tree-sitter does not promise an order for ``captures()`` (it
    varies from run to run), and facts must be identical across runs. Two
    stable sorts with C-level keys: by end descending, then by start."""
    import tree_sitter as ts

    out = {}
    for name, nodes in ts.QueryCursor(query).captures(root).items():
        nodes.sort(key=_END, reverse=True)
        nodes.sort(key=_START)
        out[name] = nodes
    return out


def comment_nodes(root: Any, data: bytes, marker: bytes = b"alloc-audit:") -> list[Any]:
    """Comment nodes that contain ``marker``, found by a byte search and a
    descent to the node at each hit (capturing every comment would cost more
    than finding the few that matter)."""
    out: list[Any] = []
    seen: set[int] = set()
    at = data.find(marker)
    while at >= 0:
        node = root.descendant_for_byte_range(at, at + len(marker))
        while node is not None and node.type != "comment" and node.parent is not None and \
                node.end_byte - node.start_byte < len(marker):
            node = node.parent
        if node is not None and node.type == "comment" and node.start_byte not in seen:
            seen.add(node.start_byte)
            out.append(node)
        at = data.find(marker, at + len(marker))
    return out


_HEADERS = {"function_definition": ("parameters", "declarator", "name"), "class_definition": ("name", "superclasses"),
            "class_specifier": ("name",), "struct_specifier": ("name",)}


def enclosing(node: Any, node_type: str) -> Any | None:
    """``node`` itself or its nearest ancestor of ``node_type`` (a function
    or class definition around a call), None when there is none."""
    while node is not None and node.type != node_type:
        node = node.parent
    return node


class Ancestry:
    """Parents of the nodes an extractor asks about, mostly in document
    order, in amortised constant time. tree-sitter's ``Node.parent`` walks
    down from the root on every call, O(depth); in a 20,000-branch
    ``else if`` chain the depth is the chain's length, and asking for every
    site's parent made extraction quadratic (231 s, issue 14). This keeps
    the path from the root to the last node asked about and moves along it:
    up to the first ancestor that contains the next node, then down."""

    __slots__ = ("_path", "steps")

    def __init__(self, root: Any) -> None:
        self._path = [root]
        self.steps = 0  # nodes walked down to, in total (linear in the tree: tests/test_nodes.py)

    def parent(self, node: Any) -> Any | None:
        path = self._path
        # walking up from the last node: it is on the path already
        for i in range(len(path) - 1, max(-1, len(path) - 32), -1):
            if path[i] == node:
                return path[i - 1] if i > 0 else None
        start, end = node.start_byte, node.end_byte
        while len(path) > 1 and not (path[-1].start_byte <= start and end <= path[-1].end_byte):
            path.pop()
        while path[-1] != node:
            child = path[-1].child_with_descendant(node)
            if child is None:  # not below the path (an empty node at a boundary)
                return node.parent
            path.append(child)
            self.steps += 1
        return path[-2] if len(path) > 1 else None

    def ancestors(self, node: Any) -> list[Any]:
        """``node``'s ancestors, its parent first and the root last: what
        asking ``parent`` again and again answers, read off the path in one
        step (the path from the root leads to ``node`` once its parent is
        known)."""
        first = self.parent(node)
        if first is None:
            return []
        path = self._path
        for i in range(len(path) - 1, 0, -1):
            if path[i] == node:
                if path[i - 1] == first:
                    return path[i - 1::-1]
                break
        out = [first]  # not on the path (an empty node at a boundary): one parent at a time
        while (up := self.parent(out[-1])) is not None:
            out.append(up)
        return out


def inside_error(node: Any, parent_of: Callable[[Any], Any | None] | None = None) -> bool:
    """Whether a node lies inside an ERROR node, or inside a definition whose
    header the parser had to repair (its scope boundaries are then guesses).
    Walks up the tree: use sparingly."""
    up = parent_of or _parent
    parent = up(node)
    while parent is not None:
        if parent.type == "ERROR":
            return True
        fields = _HEADERS.get(parent.type)
        if fields is not None and parent.has_error:
            for name in fields:
                part = parent.child_by_field_name(name)
                if part is not None and part.has_error:
                    return True
        parent = up(parent)
    return False


def _parent(node: Any) -> Any | None:
    return node.parent


def annotation_comments(src: Source, comments: list[Any], comment_starts: bytes | tuple[bytes, ...],
                        ) -> list[Annotation]:
    """The ``alloc-audit:`` comments among ``comments``; one on its own line
    applies to the next code line (lines starting with ``comment_starts``
    are comments, not code)."""
    out = []
    lines: list[bytes] | None = None
    for node in comments:
        raw = node.text
        if MARKER.encode() not in raw:
            continue
        found = parse_annotation(raw.decode("utf-8", "replace"), node.start_point[0] + 1,
                                 src.line_prefix_blank(node))
        if found is not None:
            if found.own_line:
                lines = lines if lines is not None else src.data.splitlines()
                below = next_code_line(lines, node.end_point[0] + 1, comment_starts)
                found = dataclasses.replace(found, applies_to=below)
            out.append(found)
    return out


def statement_line(node: Any, statement_parents: Collection[str],
                   parent_of: Callable[[Any], Any | None] | None = None) -> int:
    """The first line of the statement holding ``node`` (the child of the
    nearest block-like parent)."""
    up = parent_of or _parent
    child = node
    parent = up(node)
    while parent is not None and parent.type not in statement_parents:
        child, parent = parent, up(parent)
    return int(child.start_point[0]) + 1


def ends_flow(body: Any, flow_ends: Collection[str]) -> bool:
    """Whether a block's last statement (comments aside) leaves it: return,
    raise/throw, break, continue."""
    if body.type in flow_ends:
        return True
    kids = [c for c in body.named_children if c.type != "comment"]
    return bool(kids) and kids[-1].type in flow_ends


def mark_exported(sites: list[Site], exported: Mapping[str, Collection[str]],
                  name_of: Callable[[str], str] = str) -> list[Site]:
    """Sites whose target (``name_of`` it) is handed to an export call in
    their scope (``exported``: scope -> names in those calls) are IPC."""
    out = []
    for site in sites:
        if site.target and site.kind is not SiteKind.RELEASE and name_of(site.target) in exported.get(site.scope, ()):
            site = dataclasses.replace(site, kind=SiteKind.IPC)
        out.append(site)
    return out


def wrapping_call(node: Any, call_type: str, keyword_type: str | None = None,
                  parent_of: Callable[[Any], Any | None] | None = None) -> Any | None:
    """The function node of the call ``node`` is an argument of (directly,
    or as a keyword argument's value), if any."""
    up = parent_of or _parent
    parent = up(node)
    if keyword_type is not None and parent is not None and parent.type == keyword_type:
        parent = up(parent)
    outer = up(parent) if parent is not None and parent.type == "argument_list" else None
    if outer is None or outer.type != call_type:
        return None
    return outer.child_by_field_name("function")


@dataclasses.dataclass(frozen=True)
class SiteAt:
    """Where an extractor found sites: the file, its language, the node types
    that hold statements, and whether the parser had to recover."""

    path: str
    language: Language
    statement_parents: Collection[str]
    damaged: bool
    # how to find a node's parent: an extractor's Ancestry (Node.parent is
    # O(depth) per call)
    parent_of: Callable[[Any], Any | None] | None = None

    def site(self, node: Any, api: str, kind: SiteKind, scope: str, span: Span, size: str | None,
             shape: tuple[str, ...], device: str | None, target: str | None, wrapper: str | None,
             dtype: str | None = None) -> Site:
        """The census site of the call ``node``."""
        return Site(path=self.path, span=span, language=self.language, api=api, kind=kind, scope=scope,
                    size=size, shape=shape, dtype=dtype, device=device, target=target, wrapper=wrapper,
                    stmt_line=statement_line(node, self.statement_parents, self.parent_of),
                    recovered=self.damaged and inside_error(node, self.parent_of))


class Blocks:
    """Collects a file's blocks (if/else/loop/try bodies and their tests),
    each in the scope ``scope_of`` names for its statement node."""

    def __init__(self, src: Source, scope_of: Callable[[Any], str], flow_ends: Collection[str]) -> None:
        self._src = src
        self._scope_of = scope_of
        self._flow_ends = flow_ends
        self._out: list[Block] = []

    def add(self, kind: str, owner: Any, body: Any | None, test: Any | None, stmt: Any) -> None:
        if body is None:
            return
        span = self._src.span
        self._out.append(Block(kind=kind, scope=self._scope_of(owner), span=span(body),
                               test=self._src.text(test) if test is not None else "",
                               exits=ends_flow(body, self._flow_ends), stmt=span(stmt)))

    def in_order(self) -> list[Block]:
        self._out.sort(key=lambda b: (b.span.line, b.span.col, b.kind))
        return self._out


# factories whose shape arguments are all dimensions: a literal 0 among them
# makes a tensor with no elements, which holds no memory (an `empty(0)`
# placeholder, or an alias that `.set_(storage)` points at memory owned elsewhere)
_SHAPED = frozenset({"torch.empty", "torch.zeros", "torch.ones", "torch.rand", "torch.randn", "torch.empty_strided",
                     "Tensor.new_empty", "Tensor.new_zeros", "Tensor.new_ones", "cupy.empty", "cupy.zeros",
                     "at::empty", "at::zeros", "at::ones", "at::empty_strided", "torch::empty", "torch::zeros",
                     "torch::ones", "torch::empty_strided", "Tensor::new_empty", "Tensor::new_zeros",
                     "at::rand", "at::randn", "torch::rand", "torch::randn", "at::full", "torch::full",
                     "torch.UntypedStorage", "torch.TypedStorage", "torch.storage.UntypedStorage",
                     "torch.storage.TypedStorage", "torch.cuda.UntypedStorage", "torch.full", "Tensor.new_full"})
# the size is the first argument only: a stride or a fill value follows (`torch.full((0, 2), -1)`)
_SIZE_FIRST = ("empty_strided", "torch.full", "Tensor.new_full")


_FROM_DATA = frozenset({"torch.tensor", "torch.as_tensor", "torch.asarray"})


def zero_elements(api: str, shape: tuple[str, ...]) -> bool:
    """True when a shaped factory's dimensions include a literal 0."""
    if api in _FROM_DATA:  # `torch.tensor([])`: no data, no elements
        return bool(shape) and shape[0].replace(" ", "") in ("", "[]", "()", "[[]]")
    return any(d.strip() == "0" for d in shape_dims(api, shape))


def shape_dims(api: str, shape: tuple[str, ...]) -> tuple[str, ...]:
    """A shaped factory's dimensions as written (``torch.zeros((b, n), dtype=t)``: ``b``, ``n``); none for
    another call."""
    if api not in _SHAPED or not shape:
        return ()
    dims = shape[:1] if api.endswith(_SIZE_FIRST) else shape
    if len(dims) == 1 and dims[0].strip()[:1] in "({[":
        dims = tuple(split_top_level(dims[0].strip()[1:-1]))
    return dims


_ZERO_RECEIVER = re.compile(r"(torch\.(?:empty|zeros|ones|rand|randn))\((.*)\)", re.S)


def zero_element_receiver(text: str) -> bool:
    """A move's receiver that is a shaped torch factory with a literal 0
    dimension (``torch.empty(0, 4).to(device)``): nothing to copy."""
    m = _ZERO_RECEIVER.fullmatch(text.strip())
    return m is not None and zero_elements(m.group(1), tuple(p for p in split_top_level(m.group(2)) if "=" not in p))


def placed(placement: str | None) -> bool:
    """Whether a checkpoint reader's placement argument (``map_location=``,
    ``device=``) puts what it reads somewhere the call decides. Absent, the
    reader keeps its own default (the host for ``load_file``, the placement
    each tensor was saved with for ``torch.load``, which the code does not
    say): no site. A ``lambda storage, loc: ...`` hands back each storage as
    read (the host) or moves it, and the move in its body is the site."""
    return placement is not None and not placement.lstrip("( \t\r\n").startswith("lambda")
