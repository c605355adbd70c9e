"""The content-hash cache of per-file facts (and of whole results).

Layout under the cache directory (``.alloc-audit-cache/`` at the project root
by default; it writes its own ``.gitignore`` so git never sees it)::

    CACHEDIR.TAG, .gitignore
    v2/facts/ab/<key>      marshal of one parsed file's facts
    v2/stat-<root>         path -> (size, mtime_ns, inode, digest): lets a warm
                           run skip reading files whose stat is unchanged
    v2/skips-<root>        fact key -> (path, identifiers, warning) of the files
                           the pre-filter skipped (most files: one table, not
                           a file each)
    v2/result-<key>        a whole run's output, keyed by every input

A fact key hashes the file's path, content digest and language with the
``salt`` (tool version, catalogue/rule-pack digest, grammar versions, Python
version), so changing any of them misses. Every write is a temp file plus
``os.replace``: a killed run leaves at worst a stray temp file, never a torn
entry, and concurrent runs that write the same key write the same bytes.
Each entry is (magic, salt, checksum, payload): a read that fails to decode,
names another salt (tool version, ...) or whose payload does not match its
checksum is a miss. A cache directory deleted during a run is created again
at the next write, or bypassed when it cannot be; a cache never makes a run
fail or lose a site. The cache prunes itself: entries not
used for a week are deleted when the directory has grown past a threshold.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import atomic_write_bytes
from ..model import FileError, Finding, ScanResult, Site, Stats

if TYPE_CHECKING:
    from .discover import SourceFile

_FORMAT = "v2"  # v2: entries carry a checksum of their payload
_MAGIC = "alloc-audit-cache"
_PRUNE_AFTER_SECONDS = 7 * 24 * 3600
_PRUNE_THRESHOLD = 20_000


_GRAMMARS = ("tree-sitter", "tree-sitter-python", "tree-sitter-cpp", "tree-sitter-cuda")


def grammar_versions() -> str:
    """Versions of the binding and the grammars, for the cache key. Read from
    the ``NAME-VERSION.dist-info`` folder names on ``sys.path``, the first one
    of each name (as ``importlib.metadata`` finds them, without importing it:
    that import alone costs the warm ``check`` ~20 ms); a distribution not
    found that way is asked of ``importlib.metadata``."""
    wanted = {dist.replace("-", "_"): dist for dist in _GRAMMARS}
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                dist, _, version = name[:-len(".dist-info")].partition("-")
                key = wanted.get(dist.lower())
                if key is not None and version and key not in found:
                    found[key] = version
        if len(found) == len(wanted):
            break
    parts = []
    for dist in _GRAMMARS:
        if dist not in found:
            from importlib.metadata import PackageNotFoundError
            from importlib.metadata import version as dist_version

            try:
                found[dist] = dist_version(dist)
            except PackageNotFoundError:
                found[dist] = "?"
        parts.append(f"{dist}={found[dist]}")
    return ";".join(parts)


def content_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class Cache:
    def __init__(self, directory: Path | None, salt: str) -> None:
        self.directory = directory
        self.salt = salt
        self.base = directory / _FORMAT if directory is not None else None
        self._ready = False
        self._dirs: set[Path] = set()

    @property
    def enabled(self) -> bool:
        return self.base is not None

    def _prepare(self) -> None:
        """Create the directory (again, when it vanished during the run); a
        cache that cannot be created is bypassed: it only costs time."""
        if self._ready or self.directory is None:
            return
        assert self.base is not None
        try:
            (self.base / "facts").mkdir(parents=True, exist_ok=True)
            for name, content in (
                (".gitignore", "# created by alloc-audit\n*\n"),
                ("CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n# alloc-audit cache directory\n"),
            ):
                path = self.directory / name
                if not path.exists():
                    atomic_write_bytes(path, content.encode())
        except OSError:
            return
        self._ready = True

    # ------------------------------------------------------------ per-file facts
    def fact_key(self, path: str, digest: str, language: str) -> str:
        return hashlib.blake2b(f"{self.salt}\0{path}\0{digest}\0{language}".encode(), digest_size=16).hexdigest()

    def _fact_path(self, key: str) -> Path:
        assert self.base is not None
        return self.base / "facts" / key[:2] / key

    def load(self, key: str) -> Any | None:
        if self.base is None:
            return None
        return self._read(self._fact_path(key))

    def store(self, key: str, value: Any) -> None:
        if self.base is None:
            return
        self._prepare()
        path = self._fact_path(key)
        if path.parent not in self._dirs:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                return
            self._dirs.add(path.parent)
        self._write(path, value)

    # ------------------------------------------------------------ stat cache and results
    def _named(self, kind: str, key: str) -> Path:
        assert self.base is not None
        return self.base / f"{kind}-{key}"

    def load_stat(self, root_key: str) -> dict[str, tuple[int, int, int, str]]:
        if self.base is None:
            return {}
        data = self._read(self._named("stat", root_key))
        return data if isinstance(data, dict) else {}

    def store_stat(self, root_key: str, table: dict[str, tuple[int, int, int, str]]) -> None:
        if self.base is None:
            return
        self._prepare()
        self._write(self._named("stat", root_key), table)

    def load_skips(self, root_key: str) -> dict[str, tuple[str, str, str | None]]:
        """Files the pre-filter skipped, by fact key: (path, identifiers,
        warning). One entry per tree rather than a file per skipped file:
        most files are skipped, and a file per entry costs more to write
        than the pre-filter costs to run."""
        if self.base is None:
            return {}
        data = self._read(self._named("skips", root_key))
        if data is None:
            # a tree at another path (a fresh CI checkout somewhere else, a
            # copy): the newest table of another root seeds this one. Its
            # entries are keyed by salt, relative path and content digest,
            # so an entry that matches is as true here as there.
            others = sorted(self.base.glob("skips-*"), key=_mtime_or_zero, reverse=True)
            data = self._read(others[0]) if others else None
        return data if isinstance(data, dict) else {}

    def store_skips(self, root_key: str, table: dict[str, tuple[str, str, str | None]]) -> None:
        if self.base is None:
            return
        self._prepare()
        self._write(self._named("skips", root_key), table)

    def load_result(self, key: str) -> Any | None:
        if self.base is None:
            return None
        return self._read(self._named("result", key))

    def store_result(self, key: str, value: Any) -> None:
        if self.base is None:
            return
        self._prepare()
        self._write(self._named("result", key), value)
        self._prune_results()

    # ------------------------------------------------------------ io
    def _read(self, path: Path) -> Any | None:
        """The stored value, or None (a miss) when the entry is absent,
        torn, from another tool version or salt, or its payload does not
        match its checksum (an entry edited by hand or by a disk)."""
        try:
            with open(path, "rb") as fh:
                blob = fh.read()
            magic, salt, checksum, payload = marshal.loads(blob)
            if magic != _MAGIC or salt != self.salt or not isinstance(payload, bytes) \
                    or checksum != _checksum(payload):
                return None
            return marshal.loads(payload)
        except (OSError, EOFError, ValueError, TypeError):
            return None

    def _write(self, path: Path, value: Any) -> None:
        """Temp file and rename, like ``atomic_write_bytes``, made light for
        entries written by the thousand: a temp name per process is enough
        (concurrent runs are other processes), no mode to keep, no fsync (a
        torn entry after a crash fails to decode and is a miss)."""
        payload = marshal.dumps(value)
        blob = marshal.dumps((_MAGIC, self.salt, _checksum(payload), payload))
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        for attempt in (1, 2):
            try:
                with open(tmp, "wb") as fh:
                    fh.write(blob)
                os.replace(tmp, path)
                return
            except FileNotFoundError:
                if attempt == 2:
                    break
                # the directory was deleted during the run: create it again
                self._ready = False
                self._dirs.clear()
                self._prepare()
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError:
                    break
            except OSError:
                break
        try:
            os.unlink(tmp)
        except OSError:
            pass  # a cache that cannot be written only costs time

    def _prune_results(self, keep: int = 8) -> None:
        assert self.base is not None
        try:
            results = sorted(self.base.glob("result-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return
        for old in results[keep:]:
            try:
                old.unlink()
            except OSError:
                pass

    def prune(self, now: float | None = None) -> int:
        """Delete fact entries unused for a week (and stray temp files) once
        the cache has grown large. Returns how many files were removed."""
        if self.base is None or not (self.base / "facts").is_dir():
            return 0
        now = time.time() if now is None else now
        try:
            entries = [p for d in (self.base / "facts").iterdir() if d.is_dir() for p in d.iterdir()]
        except OSError:  # deleted while we looked
            return 0
        if len(entries) < _PRUNE_THRESHOLD:
            return 0
        removed = 0
        for path in entries:
            try:
                st = path.stat()
                if now - max(st.st_mtime, st.st_atime) > _PRUNE_AFTER_SECONDS or path.name.endswith(".tmp"):
                    path.unlink()
                    removed += 1
            except OSError:
                continue
        return removed

    def touch(self, key: str) -> None:
        if self.base is None:
            return
        try:
            os.utime(self._fact_path(key))
        except OSError:
            pass


# ---------------------------------------------------------------- a run's cache


class RunCache:
    """What a run keeps for the next one besides each file's facts: the
    root's stat table (size, mtime, inode -> content digest), the files the
    pre-filter skipped, and whole results keyed by every input. On the warm
    path (every file's digest known), a stored result is the answer."""

    def __init__(self, cache: Cache, root: Path) -> None:
        self.cache = cache
        self.root_key = hashlib.blake2b(str(root.resolve()).encode(), digest_size=8).hexdigest()
        self.stat_table = cache.load_stat(self.root_key)

    def known_digests(self, files: Sequence[SourceFile]) -> tuple[dict[str, str], list[SourceFile]]:
        """Digests known without reading (stat unchanged), and the files whose
        stat changed. When few changed (or were only touched), they are hashed
        here: a whole run's result may still be stored for exactly this content."""
        digests: dict[str, str] = {}
        for f in files:
            known = self.stat_table.get(f.path)
            if known is not None and known[:3] == (f.size, f.mtime_ns, f.inode):
                digests[f.path] = known[3]
        misses = [f for f in files if f.path not in digests]
        if self.cache.enabled and len(misses) <= max(8, len(files) // 20):
            for f in misses:
                try:
                    with open(f.abspath, "rb") as fh:
                        digests[f.path] = content_digest(fh.read())
                except OSError:
                    break
        return digests, misses

    def stored_result(self, key: str, files: Sequence[SourceFile], digests: dict[str, str],
                      misses: Sequence[SourceFile], root: Path, seconds: float) -> ScanResult | None:
        stored = self.cache.load_result(key)
        if stored is None:
            return None
        if misses:
            table = dict(self.stat_table)
            table.update({f.path: (f.size, f.mtime_ns, f.inode, digests[f.path]) for f in misses})
            self.cache.store_stat(self.root_key, table)
        try:
            return _decode_result(stored, root, seconds)
        except (TypeError, ValueError):  # a result stored in an older layout: a miss
            return None

    def skip_table(self) -> dict[str, tuple[str, str, str | None]]:
        return self.cache.load_skips(self.root_key) if self.cache.enabled else {}

    def hash_skipped(self, misses: Sequence[SourceFile], digests: dict[str, str],
                     skip_table: dict[str, tuple[str, str, str | None]]) -> None:
        """Digests, read here, of the files whose stat is unknown but which
        the skip table names (a fresh checkout with a restored cache: every
        mtime and inode is new). Hashing a file costs a fraction of the
        pre-filter and identifier scan a worker would run on it again; a
        file whose content changed misses the table and goes to the workers
        as before."""
        if not skip_table:
            return
        named = {entry[0] for entry in skip_table.values()}
        for f in misses:
            if f.path in named and f.path not in digests:
                try:
                    with open(f.abspath, "rb") as fh:
                        digests[f.path] = content_digest(fh.read())
                except OSError:
                    continue  # the workers report it

    def store(self, files: Sequence[SourceFile], digests: dict[str, str],
              skips: dict[str, tuple[str, str, str | None]],
              old_skips: dict[str, tuple[str, str, str | None]], result_key: str | None,
              result: ScanResult) -> None:
        """After a run: the stat and skip tables (keeping entries of files
        outside this run's paths) and, when every file was read, the result."""
        cache = self.cache
        if not cache.enabled:
            return
        table = {f.path: (f.size, f.mtime_ns, f.inode, digests[f.path]) for f in files if f.path in digests}
        for path, entry in self.stat_table.items():
            table.setdefault(path, entry)
        cache.store_stat(self.root_key, table)
        ours = {f.path for f in files}
        for fact_key, skip in old_skips.items():
            if skip[0] not in ours:
                skips.setdefault(fact_key, skip)
        cache.store_skips(self.root_key, skips)
        if result_key is not None:
            cache.store_result(result_key, _encode_result(result))
        cache.prune()


def _mtime_or_zero(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def result_key(cache: Cache, inputs: object, files: Sequence[SourceFile], digests: dict[str, str]) -> str:
    """The key of a whole result: the salt, ``inputs`` (what else decides the
    result: tiers, enabled rules, severities...) and every file's digest."""
    h = hashlib.blake2b(digest_size=20)
    h.update(cache.salt.encode())
    h.update(repr(inputs).encode())
    for f in files:
        h.update(f"{f.path}\0{digests[f.path]}\n".encode())
    return h.hexdigest()


def _encode_result(result: ScanResult) -> Any:
    from . import serial

    return (
        tuple(serial.encode(s) for s in result.sites),
        tuple(serial.encode(f) for f in result.findings),
        tuple(serial.encode(e) for e in result.errors),
        (result.stats.files, result.stats.parsed, result.stats.parse_errors, result.stats.lines),
        tuple(sorted(result.scanned_paths)),
        tuple(serial.encode(e) for e in result.unchecked),
    )


def _decode_result(stored: Any, root: Path, seconds: float) -> ScanResult:
    from . import serial

    sites, findings, errors, stats, scanned, unchecked = stored
    return ScanResult(
        root=root,
        sites=tuple(serial.decode(Site, s) for s in sites),
        findings=tuple(serial.decode(Finding, f) for f in findings),
        errors=tuple(serial.decode(FileError, e) for e in errors),
        stats=Stats(files=stats[0], parsed=stats[1], parse_errors=stats[2], seconds=seconds, lines=stats[3]),
        scanned_paths=frozenset(scanned),
        unchecked=tuple(serial.decode(FileError, e) for e in unchecked),
    )
