"""Helpers over tree-sitter nodes shared by the extractors: spans with
code-point columns, capped texts, and the sweep that gives every captured
node its innermost enclosing scope. Nothing here keeps a node beyond the
extraction of one file."""

from __future__ import annotations

import re
from bisect import bisect_right
from operator import attrgetter
from typing import Any, Callable, Sequence

from ..model import Span

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
