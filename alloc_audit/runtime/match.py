"""Runtime, match: a recorded stack -> the census site (or bucket) it belongs to.

Input: the census (sites and per-file facts of a scan) and the recorded
stacks; output one :class:`Attribution` per distinct stack. Pure.

Frame paths are the recording machine's (``/app/pkg/x.py``, a site-packages
install): each is mapped to the scanned tree by the longest matching suffix
of path components (at least the file and its folder, or the file alone
when the frame names only a file), after ``--path-map OLD=NEW`` rewrites.
The innermost frame inside the tree decides:

- **exact**: a site of a compatible kind whose lines hold the frame's line.
  An outer frame that is a derived site of that site (``self.buf =
  self._make_buffer(...)``) makes the attribution more specific: the bytes
  go to the caller's buffer, not to the helper's one allocation line.
- **function**: the frame's line holds no site, and the current source says
  the line is not in a function of the frame's name: the snapshot was taken
  on another commit. The nearest compatible site in a function of that
  name gets the bytes, reported as a function match.
- **implicit**: a project line with no site, in the function it claims to be
  in (an op's output, ``x @ y``, a library's workspace): an implicit
  allocation point, the census's blind spot.

C++ frames (``stacks="all"``, files ``??`` and line 0) match by function
name alone, against the scopes of native sites. Stacks with no frames, or
none inside the tree, go to the ``no-frames`` and ``outside-root`` buckets.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..model import FileFacts, Site, SiteKind
from .snapshot import Frame

# the site kinds whose memory PyTorch's caching allocator hands out
# (a graph-pool handle allocates nothing itself: its memory shows as capture
# allocations, per pool)
ALLOCATOR_KINDS = frozenset({SiteKind.DEVICE, SiteKind.WORKSPACE})
# the kinds a native record (cudaMalloc and friends) can show
NATIVE_KINDS = frozenset({SiteKind.DEVICE, SiteKind.IPC, SiteKind.MANAGED, SiteKind.PINNED_HOST, SiteKind.VIRTUAL,
                          SiteKind.WORKSPACE})

EXACT, FUNCTION, IMPLICIT, OUTSIDE, NO_FRAMES = "exact", "function", "implicit", "outside-root", "no-frames"


@dataclass(frozen=True, slots=True)
class PathMap:
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class Attribution:
    """Where one stack's bytes go. ``site`` indexes the census's sites;
    ``path``/``line``/``function`` name the deciding frame (mapped)."""

    how: str
    site: int | None = None
    path: str = ""
    line: int = 0
    function: str = ""
    capture: bool = False  # a frame lies in the body of a capture context
    native: bool = False  # decided by a C++ frame's name


def parse_path_map(text: str) -> PathMap:
    old, sep, new = text.partition("=")
    if not sep or not old:
        raise ValueError(f"--path-map wants OLD=NEW, got {text!r}")
    return PathMap(old, new)


def cpp_function_name(name: str) -> str:
    """``minigen::DeviceArena::grow(unsigned long) const`` -> ``minigen::DeviceArena::grow``."""
    name = name.replace("(anonymous namespace)", "{anon}")
    cut = name.find("(")
    return (name[:cut] if cut >= 0 else name).strip()


@dataclass
class _FileIndex:
    sites: list[tuple[int, int, int]] = field(default_factory=list)  # (first line, last line, site index)
    scopes: list[tuple[int, int, str]] = field(default_factory=list)  # functions: (line, end_line, qualname)
    captures: list[tuple[int, int]] = field(default_factory=list)  # bodies of capture contexts


class Matcher:
    """Attributes stacks to sites; every answer is cached per stack and per
    file name, so a long trace costs one lookup per distinct stack."""

    def __init__(self, sites: Sequence[Site], files: Mapping[str, FileFacts], project_paths: Iterable[str],
                 root: str, path_maps: Sequence[PathMap] = (), kinds: frozenset[SiteKind] = ALLOCATOR_KINDS,
                 capture_contexts: Sequence[str] = ("torch.cuda.graph", "torch.cuda.graphs.graph"),
                 load_facts: Callable[[str], FileFacts | None] | None = None) -> None:
        """``files`` holds the facts a scan kept; ``load_facts`` reads those
        of another scanned file on demand (a cached scan keeps none), for the
        function spans and capture regions of the files the stacks name."""
        self.sites = sites
        self._capture_contexts = tuple(capture_contexts)
        self._load_facts = load_facts
        self._loaded: set[str] = set()
        self.root = root.rstrip("/")
        self.path_maps = tuple(path_maps)
        self.kinds = kinds
        self._by_file: dict[str, _FileIndex] = {}
        self._by_basename: dict[str, list[tuple[str, ...]]] = {}
        self._paths = frozenset(project_paths) | frozenset(s.path for s in sites)
        for p in sorted(self._paths):
            parts = tuple(p.split("/"))
            self._by_basename.setdefault(parts[-1], []).append(parts)
        self._derived: dict[tuple[str, int], list[int]] = {}  # via (path, line) -> derived site indexes
        self._cpp_scopes: dict[str, list[int]] = {}
        for i, site in enumerate(sites):
            if site.kind not in kinds:
                continue
            first = min(site.stmt_line or site.span.line, site.span.line)
            self._file(site.path).sites.append((first, site.span.end_line, i))
            if site.via is not None:
                self._derived.setdefault((site.via.path, site.via.line), []).append(i)
            if site.language.value != "python":
                self._cpp_scopes.setdefault(site.scope, []).append(i)
        for path, facts in files.items():
            self._absorb(path, facts)
        for index in self._by_file.values():
            index.sites.sort()
        # native derived sites by the function their allocation is in: a
        # constructor with four allocations is one derived site for its caller
        at = {(x.path, x.span.line): x for x in sites if x.via is None}
        self._derived_by_scope: dict[tuple[str, str], list[int]] = {}
        for (path, line), ks in self._derived.items():
            base = at.get((path, line))
            if base is not None and base.language.value != "python":
                self._derived_by_scope.setdefault((path, base.scope), []).extend(ks)
        self.mapped: dict[str, str | None] = {}
        # derived sites seen further out on a stack than the one that got the bytes
        self.outer_derived: set[int] = set()
        self._stacks: dict[tuple[Frame, ...], Attribution] = {}

    def _absorb(self, path: str, facts: FileFacts) -> None:
        index = self._file(path)
        index.scopes = sorted((s.span.line, s.span.end_line, s.qualname) for s in facts.scopes
                              if s.role not in ("module", "class"))
        index.captures = [(w.body.line, w.body.end_line) for w in facts.withs
                          if any(_glob_any(item.callee, self._capture_contexts) for item in w.items)]
        self._loaded.add(path)

    def _ensure(self, path: str) -> None:
        if path not in self._loaded:
            self._loaded.add(path)
            facts = self._load_facts(path) if self._load_facts is not None else None
            if facts is not None:
                self._absorb(path, facts)

    def _file(self, path: str) -> _FileIndex:
        index = self._by_file.get(path)
        if index is None:
            index = self._by_file[path] = _FileIndex()
        return index

    # ------------------------------------------------------------ paths

    def map_path(self, filename: str) -> str | None:
        """The scanned file a frame's file name stands for, or None."""
        found = self.mapped.get(filename, "")
        if found != "":
            return found
        result = self._map_path(filename)
        self.mapped[filename] = result
        return result

    def _map_path(self, filename: str) -> str | None:
        name = filename.replace("\\", "/")
        for m in self.path_maps:
            if name.startswith(m.old):
                name = m.new + name[len(m.old):]
                rel = name[len(self.root) + 1:] if name.startswith(self.root + "/") else name
                rel = posixpath.normpath(rel)
                if rel in self._paths:
                    return rel
                break
        if name.startswith(self.root + "/"):
            rel = name[len(self.root) + 1:]
            if rel in self._paths:
                return rel
        parts = tuple(p for p in name.split("/") if p and p != ".")
        if not parts:
            return None
        candidates = self._by_basename.get(parts[-1])
        if not candidates:
            return None
        best, best_len, tie = None, 0, False
        for cand in candidates:
            n = 0
            while n < len(cand) and n < len(parts) and cand[-1 - n] == parts[-1 - n]:
                n += 1
            if n > best_len:
                best, best_len, tie = cand, n, False
            elif n == best_len:
                tie = True
        if best is None or tie:
            return None
        # the file and its folder must agree, unless the frame names a bare file
        # (compute-sanitizer prints `pool.py:34`) or the scanned path is one part
        if best_len < 2 and len(parts) > 1 and len(best) > 1:
            return None
        return "/".join(best)

    # ------------------------------------------------------------ stacks

    def attribute(self, stack: tuple[Frame, ...]) -> Attribution:
        found = self._stacks.get(stack)
        if found is None:
            found = self._stacks[stack] = self._attribute(stack)
        return found

    def _attribute(self, stack: tuple[Frame, ...]) -> Attribution:
        if not stack:
            return Attribution(NO_FRAMES)
        mapped: list[tuple[int, str]] = []  # (frame index, project path) of Python frames inside the tree
        decided: Attribution | None = None
        for i, frame in enumerate(stack):
            if frame.native:
                if decided is None and not mapped:
                    hit = self._native(stack, i)
                    if hit is not None:
                        decided = hit
                continue
            path = self.map_path(frame.filename)
            if path is not None:
                self._ensure(path)
                mapped.append((i, path))
        capture = any(self._in_capture(path, stack[i].line) for i, path in mapped)
        if decided is not None:
            return _with_capture(decided, capture)
        if not mapped:
            return Attribution(OUTSIDE)
        i, path = mapped[0]
        frame = stack[i]
        index = self._by_file.get(path)
        site = self._site_at(index, frame.line) if index else None
        if site is not None:
            site = self._refine(site, [(stack[j], p) for j, p in mapped[1:]])
            return Attribution(EXACT, site, path, frame.line, frame.name, capture)
        scope = self._scope_at(index, frame.line) if index else None
        if index is not None and index.scopes and (scope is None or _last(scope) != frame.name) \
                and frame.name not in ("<module>", "<listcomp>", "<genexpr>", "<dictcomp>", "<lambda>"):
            near = self._nearest_in_function(index, frame.name, frame.line)
            if near is not None:
                return Attribution(FUNCTION, near, path, frame.line, frame.name, capture)
        return Attribution(IMPLICIT, None, path, frame.line, scope or frame.name, capture)

    def _native(self, stack: tuple[Frame, ...], i: int) -> Attribution | None:
        """A C++ frame whose function has native sites. Which of them: the
        one whose API the frames inside it name (``cudaMallocAsync``,
        ``at::_ops::zeros::call``), else the first; then, as for Python, a
        derived site further out (``new DeviceArena(...)`` in a caller)
        names the buffer."""
        name = cpp_function_name(stack[i].name)
        hits = self._cpp_scopes.get(name)
        if not hits:
            return None
        inner = [cpp_function_name(f.name) for f in stack[:i]]
        ranked = sorted(hits, key=lambda k: (_api_rank(self.sites[k].api, inner), self.sites[k].sort_key))
        site = ranked[0]
        s = self.sites[site]
        for frame in stack[i + 1:]:
            if not frame.native:
                break
            outer = cpp_function_name(frame.name)
            for k in self._derived_by_scope.get((s.path, s.scope), ()):
                if self.sites[k].scope == outer:
                    return Attribution(FUNCTION, k, self.sites[k].path, 0, outer, native=True)
        return Attribution(FUNCTION, site, s.path, 0, name, native=True)

    def _site_at(self, index: _FileIndex, line: int) -> int | None:
        best: tuple[int, int] | None = None
        found = -1
        for first, last, k in index.sites:
            if first > line:
                break
            if line <= last:
                width = last - first
                direct = self.sites[k].via is None
                key = (width, 0 if direct else 1)
                if best is None or key < best:
                    best, found = key, k
        return found if best is not None else None

    def _refine(self, site: int, outer: list[tuple[Frame, str]]) -> int:
        """Follow derived sites outward: a caller's line that is a derived
        site of this one names which buffer the bytes are."""
        s = self.sites[site]
        key = (s.via.path, s.via.line) if s.via is not None else (s.path, s.span.line)
        found = site
        for frame, path in outer:
            for k in self._derived.get(key, ()):
                d = self.sites[k]
                if d.path == path and min(d.stmt_line or d.span.line, d.span.line) <= frame.line <= d.span.end_line:
                    if found == site:
                        found = k
                    elif k != found:
                        self.outer_derived.add(k)
        return found

    @staticmethod
    def _scope_at(index: _FileIndex, line: int) -> str | None:
        best: tuple[int, str] | None = None
        for first, last, name in index.scopes:
            if first > line:
                break
            if line <= last and (best is None or last - first < best[0]):
                best = (last - first, name)
        return best[1] if best else None

    def _nearest_in_function(self, index: _FileIndex, name: str, line: int) -> int | None:
        best: tuple[int, int] | None = None
        for first, _end, k in index.sites:
            if _last(self.sites[k].scope) == name:
                d = abs(first - line)
                if best is None or d < best[0]:
                    best = (d, k)
        return best[1] if best else None

    def _in_capture(self, path: str, line: int) -> bool:
        index = self._by_file.get(path)
        return bool(index) and any(first <= line <= last for first, last in index.captures)  # type: ignore[union-attr]


def _api_rank(api: str, inner: list[str]) -> int:
    """0 when a frame inside the function is the API itself (``cudaMalloc``),
    1 when one names it as a part (``at::_ops::zeros::call`` for
    ``torch::zeros``), 2 otherwise."""
    leaf = re.split(r"::|\.", api)[-1]
    if any(n == leaf or n.endswith(f"::{leaf}") for n in inner):
        return 0
    if any(f"::{leaf}::" in n or f"_{leaf}" in n.rsplit("::", 1)[-1] for n in inner):
        return 1
    return 2


def _with_capture(a: Attribution, capture: bool) -> Attribution:
    if not capture or a.capture:
        return a
    return Attribution(a.how, a.site, a.path, a.line, a.function, True, a.native)


def _last(qualname: str) -> str:
    return re.split(r"::|\.", qualname)[-1]


def _glob_any(name: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)
