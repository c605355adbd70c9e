"""Stage 1, discover: paths -> SourceFile records (stat only; nothing is read).

In a git work tree the file list comes from ``git ls-files --cached --others
--exclude-standard``, which is exactly git's view of ``.gitignore`` (nested
files, negations, ``info/exclude``, the global excludes file). Outside git the
tree is walked and the ``.gitignore`` files found on the way are honoured.
``include``/``exclude`` from the configuration are gitignore-style patterns
(pathspec). Symlinks are never followed: a linked file is either outside the
root or already scanned under its real path. Files over the size limit are
reported, not read.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pathspec
from pathspec.pattern import RegexPattern
from pathspec.util import normalize_file

from ..config import Config
from ..errors import UsageError
from ..model import FileError, Language

SUFFIXES: dict[str, Language] = {
    ".py": Language.PYTHON,
    ".cu": Language.CUDA,
    ".cuh": Language.CUDA,
    ".cpp": Language.CPP,
    ".cc": Language.CPP,
    ".cxx": Language.CPP,
    ".h": Language.CPP,
    ".hpp": Language.CPP,
    ".hh": Language.CPP,
}
_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".alloc-audit-cache", ".mypy_cache", ".ruff_cache",
              ".pytest_cache", ".tox", ".nox", "node_modules"}


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str  # relative to the root, "/" separators
    abspath: str
    language: Language
    size: int
    mtime_ns: int
    inode: int


@dataclass(frozen=True)
class Discovery:
    files: tuple[SourceFile, ...]
    errors: tuple[FileError, ...]
    # source files found but not read (over the size limit, a name that is
    # not UTF-8): their sites are unknown, so their allowlist entries are
    # "not checked" rather than stale (see pipeline.ScanResult.unchecked)
    unchecked: tuple[FileError, ...] = ()


def language_of(path: str) -> Language | None:
    return SUFFIXES.get(os.path.splitext(path)[1].lower())


def discover_files(config: Config, paths: Iterable[Path] = ()) -> Discovery:
    """The source files under ``paths`` (default: the root), sorted by path."""
    root = config.root.resolve()
    targets = [Path(os.path.abspath(p)) for p in paths] or [root]
    for target in targets:
        if not target.exists() and not target.is_symlink():
            raise UsageError(f"no such file or directory: {target}")
        if not _inside(target, root):
            raise UsageError(f"{target} is outside the project root {root}")
    include = GitIgnore(pathspec.GitIgnoreSpec.from_lines(config.include)) if config.include else None
    exclude = GitIgnore(pathspec.GitIgnoreSpec.from_lines([*config.exclude, f"{config.cache_dir}/"]))
    explicit = [t for t in targets if not t.is_dir()]
    directories = [t for t in targets if t.is_dir()]
    candidates: set[str] = set()
    for target in explicit:
        candidates.add(target.relative_to(root).as_posix())
    explicit_rels = set(candidates)
    if directories:
        listed = _git_files(root, directories)
        candidates.update(listed if listed is not None else _walk(root, directories))
    files: list[SourceFile] = []
    errors: list[FileError] = []
    unchecked: list[FileError] = []
    for rel in sorted(candidates):
        lang = language_of(rel)
        if lang is None:
            continue
        if not _encodable(rel):
            # git and os.walk hand undecodable bytes over as surrogates: such
            # a path cannot be written to JSON, SARIF or the allowlist
            shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            problem = FileError(shown, "file name is not valid UTF-8; not scanned (rename the file)")
            errors.append(problem)
            unchecked.append(problem)
            continue
        if include is not None and not include.match_file(rel):
            continue
        if exclude.match_file(rel):
            continue
        abspath = os.path.join(root, rel)
        try:
            st = os.lstat(abspath)
        except OSError:
            continue  # deleted in the work tree but still in git's index
        if stat.S_ISLNK(st.st_mode):  # os.path.islink's own test, on the lstat above
            if rel in explicit_rels:
                errors.append(FileError(rel, "a symbolic link; links are not followed (scan the file it points to)"))
            continue
        if not stat.S_ISREG(st.st_mode):
            # a FIFO, socket or device named on the command line is reported, never dropped silently
            if rel in explicit_rels:
                errors.append(FileError(rel, f"not a regular file ({_kind(st.st_mode)}); not scanned"))
            continue
        if st.st_size > config.max_file_size:
            problem = FileError(rel, f"larger than the {_mib(config.max_file_size)} limit ({_mib(st.st_size)}); "
                                     "skipped (raise max-file-size to scan it)")
            errors.append(problem)
            unchecked.append(problem)
            continue
        files.append(SourceFile(rel, abspath, lang, st.st_size, st.st_mtime_ns, st.st_ino))
    return Discovery(tuple(files), tuple(errors), tuple(unchecked))


def _encodable(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 100 * 1024 else f"{n:,} bytes"


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def _git_files(root: Path, directories: list[Path]) -> list[str] | None:
    """Files git sees under ``directories`` (relative to ``root``), or None
    when ``root`` is not in a git work tree."""
    if not any((d / ".git").exists() for d in (root, *root.parents)):
        return None
    specs = [d.relative_to(root).as_posix() or "." for d in directories]
    try:
        proc = subprocess.run(
            ["git", "-c", "core.quotepath=off", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
             "--", *specs],
            cwd=root,
            capture_output=True,
            check=False,
        )
    except OSError:
        return None
    if proc.returncode != 0:
        return None
    return sorted({p.decode("utf-8", "surrogateescape") for p in proc.stdout.split(b"\0") if p})


def _walk(root: Path, directories: list[Path]) -> Iterator[str]:
    """Walk without git, honouring .gitignore files met on the way."""
    for top in directories:
        specs: dict[str, GitIgnore] = {}
        for base in [top, *[p for p in top.parents if _inside(p, root)]]:
            spec = _gitignore(base)
            if spec is not None:
                specs[str(base)] = spec
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            spec = _gitignore(Path(dirpath))
            if spec is not None:
                specs[dirpath] = spec
            dirnames[:] = sorted(
                d for d in dirnames
                if d not in _SKIP_DIRS and not _ignored(specs, os.path.join(dirpath, d), True)
            )
            for name in filenames:
                full = os.path.join(dirpath, name)
                if language_of(name) is not None and not _ignored(specs, full, False):
                    yield Path(full).relative_to(root).as_posix()


def _gitignore(directory: Path) -> GitIgnore | None:
    path = directory / ".gitignore"
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return GitIgnore(pathspec.GitIgnoreSpec.from_lines(lines))


def _ignored(specs: dict[str, GitIgnore], full: str, is_dir: bool) -> bool:
    for base, spec in specs.items():
        if full.startswith(base + os.sep):
            rel = full[len(base) + 1:].replace(os.sep, "/")
            if spec.match_file(rel + ("/" if is_dir else "")):
                return True
    return False


class GitIgnore:
    """A .gitignore's spec and one search for whether any of its patterns matches a path at all: most
    paths match none, and then the spec says no (it follows the last pattern that matches, none: not
    ignored); a path some pattern matches is the spec's to decide (perf-r29: the spec tries each pattern in
    turn, ~0.4 s for aphrodite's 121 patterns; tests/test_discover.py checks the two agree)."""

    __slots__ = ("spec", "_any")

    def __init__(self, spec: pathspec.PathSpec[Any]) -> None:
        self.spec = spec
        self._any = _any_pattern(spec)

    def match_file(self, path: str) -> bool:
        if self._any is not None and self._any.search(normalize_file(path)) is None:
            return False
        return self.spec.match_file(path)


def _any_pattern(spec: pathspec.PathSpec[Any]) -> re.Pattern[str] | None:
    """One pattern searching for any of ``spec``'s patterns that decide (a pattern's own search, as
    ``RegexPattern.match_file`` does); None where they cannot be joined (another kind of pattern, flags,
    bytes, a back-reference by name)."""
    sources: list[str] = []
    for pattern in spec.patterns:
        if not isinstance(pattern, RegexPattern):
            return None
        if pattern.include is None or pattern.regex is None:
            continue  # a comment or blank line: the spec skips it
        regex = pattern.regex
        if not isinstance(regex.pattern, str) or regex.flags != re.UNICODE or "(?P=" in regex.pattern:
            return None
        sources.append(_NAMED_GROUP.sub("(?:", regex.pattern))  # a name may repeat across patterns
    try:
        return re.compile("|".join(f"(?:{s})" for s in sources) if sources else "(?!)")
    except re.error:
        return None


_NAMED_GROUP = re.compile(r"\(\?P<\w+>")
