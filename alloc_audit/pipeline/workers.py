"""The per-file work, in worker processes: read one file, pre-filter it,
parse and extract it (stages 1b-3), with the facts cache. This is the
per-file error boundary (STYLE.md section 6): a bad file becomes a failed
``FileOutcome``, never an exception."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..catalog import Catalog
from ..model import FileError, FileFacts, Language
from . import serial
from .cache import Cache, content_digest
from .classify import classify_sites
from .discover import SourceFile
from .expand import mentions
from .parse import error_summary, nesting_problem, parse_source

LOG = logging.getLogger("alloc_audit")


class Status(str, enum.Enum):
    FACTS = "facts"  # parsed: ``facts`` holds the encoded facts
    SKIP = "skip"  # the pre-filter skipped it: ``identifiers`` are the names it mentions
    FAILED = "failed"  # unreadable or an internal error: ``message`` says what


@dataclass(frozen=True, slots=True)
class FileOutcome:
    path: str
    digest: str  # "" when the file could not be read
    status: Status
    facts: Any = None  # serial.encode(FileFacts), decoded by the parent
    identifiers: str = ""  # expand.identifiers' text
    message: str | None = None  # the failure, or a warning (not valid UTF-8, binary)


def process_file(source: SourceFile, catalog: Catalog, cache: Cache, force: bool = False) -> FileOutcome:
    """Read, pre-filter, parse and extract one file. Never raises for a bad
    file. ``force`` parses even when the pre-filter would skip (a file the
    expansion wants)."""
    try:
        with open(source.abspath, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return FileOutcome(source.path, "", Status.FAILED, message=f"cannot read: {exc.strerror}")
    digest = content_digest(data)
    try:
        return _facts_or_skip(source, data, digest, catalog, cache, force)
    except Exception as exc:  # the only catch-all (STYLE.md section 6)
        LOG.debug("internal error on %s", source.path, exc_info=True)
        return FileOutcome(source.path, digest, Status.FAILED,
                           message=f"internal error ({type(exc).__name__}): {exc}")


def skipped_outcome(path: str, digest: str, identifiers: str, warning: str | None) -> FileOutcome:
    return FileOutcome(path, digest, Status.SKIP, identifiers=identifiers, message=warning)


def _facts_or_skip(source: SourceFile, data: bytes, digest: str, catalog: Catalog, cache: Cache,
                   force: bool) -> FileOutcome:
    # a forced parse has its own key, so a file parsed on demand is still a
    # skip in the next run's first pass: cold and warm runs stay identical
    key = cache.fact_key(source.path, digest, source.language.value + ("+forced" if force else ""))
    cached = cache.load(key)
    if cached is not None:
        status, payload, warning = cached
        if status == Status.SKIP.value:
            return skipped_outcome(source.path, digest, payload, warning)
        return FileOutcome(source.path, digest, Status(status), facts=payload, message=warning)
    if b"\0" in data[:8192]:
        # not analysed (FAILED, not SKIP): its allowlist entries are "not checked"
        return FileOutcome(source.path, digest, Status.FAILED,
                           message="binary content (a NUL byte in the first 8 KiB); skipped")
    warning = None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        warning = (f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at line {line}); "
                   "read as bytes, texts may show replacement characters")
    # What the on-demand expansion asks of a skipped file first: the names
    # it mentions (expand.identifiers, found by the same pass as the
    # pre-filter's answer); Python files are also wanted by module name.
    # Cached by the parent, in one table (Cache.load_skips).
    mentions = None if force else catalog.prefilter.screen(data, source.language)
    if mentions is not None:
        return skipped_outcome(source.path, digest, mentions, warning)
    too_deep = nesting_problem(data, source.language)
    if too_deep is not None:
        return FileOutcome(source.path, digest, Status.FAILED, message=too_deep)
    apis = catalog.apis
    parsed = parse_source(data, source.language, apis.attribute_macros, apis.specifier_macros,
                          apis.lone_macro_lines)
    from .extract import extract_facts  # imported here: workers load it once

    facts = extract_facts(source.path, source.language, parsed, apis)
    problem = error_summary(parsed)
    errors = tuple(e for e in (warning, problem) if e)
    facts = dataclasses.replace(facts, digest=digest, errors=errors)
    encoded = serial.encode(facts)
    cache.store(key, (Status.FACTS.value, encoded, None))
    return FileOutcome(source.path, digest, Status.FACTS, facts=encoded)


def read_bytes(source: SourceFile) -> bytes:
    """A skipped file's bytes, read again for the expansion; empty when it
    cannot be read (it was read a moment ago: its error is reported then)."""
    try:
        with open(source.abspath, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def decode_facts(outcome: FileOutcome) -> FileFacts:
    return serial.decode(FileFacts, outcome.facts)


# ---------------------------------------------------------------- the pool

_WORKER: dict[str, Any] = {}


def _init_worker(catalog: Catalog, cache_dir: str | None, salt: str) -> None:
    _WORKER["catalog"] = catalog
    _WORKER["cache"] = Cache(Path(cache_dir) if cache_dir else None, salt)


def _process_batch(batch: Sequence[tuple[SourceFile, bool]]) -> list[FileOutcome]:
    catalog: Catalog = _WORKER["catalog"]
    cache: Cache = _WORKER["cache"]
    return [process_file(source, catalog, cache, force) for source, force in batch]


def job_count(jobs: int | None, configured: int | None) -> int:
    if jobs:
        return max(1, jobs)
    if configured:
        return configured
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _batches(items: list[tuple[SourceFile, bool]], jobs: int) -> list[list[tuple[SourceFile, bool]]]:
    """Balanced by bytes, largest files first, several batches per worker so
    a slow batch does not leave the others idle."""
    count = max(1, min(len(items), jobs * 24))
    batches: list[list[tuple[SourceFile, bool]]] = [[] for _ in range(count)]
    loads = [0] * count
    for item in sorted(items, key=lambda it: -it[0].size):
        i = loads.index(min(loads))
        batches[i].append(item)
        loads[i] += item[0].size + 2048
    return [b for b in batches if b]


def run_files(items: list[tuple[SourceFile, bool]], catalog: Catalog, cache: Cache,
              jobs: int) -> Iterator[FileOutcome]:
    """Outcomes as they complete (order is not kept: callers sort). The
    parent consumes them while the workers go on parsing. An item is a
    file and whether to parse it whatever the pre-filter says."""
    total_bytes = sum(s.size for s, _ in items)
    if jobs <= 1 or len(items) < 16 or total_bytes < 1_000_000:
        for source, force in items:
            yield process_file(source, catalog, cache, force)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    catalog.prefilter.screen(b"", Language.PYTHON)  # compiled once here (lazy), not once per worker
    cache_dir = str(cache.directory) if cache.enabled and cache.directory is not None else None
    initargs = (catalog, cache_dir, cache.salt)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_init_worker,
                             initargs=initargs) as pool:
        pending = {pool.submit(_process_batch, batch): batch for batch in _batches(items, jobs)}
        try:
            for future in as_completed(list(pending)):
                outcomes = future.result()
                del pending[future]
                yield from outcomes
        except BrokenProcessPool:
            LOG.debug("a worker died; %d batches are run again one file at a time", len(pending))
    left: list[tuple[SourceFile, bool]] = []
    for future, batch in pending.items():
        if future.done() and not future.cancelled() and future.exception() is None:
            yield from future.result()
        else:
            left.extend(batch)
    if left:
        yield from _run_isolated(left, context, initargs)


def _run_isolated(items: list[tuple[SourceFile, bool]], context: Any,
                  initargs: tuple[Catalog, str | None, str]) -> Iterator[FileOutcome]:
    """After a worker died (a native crash in a parser): the files of the
    batches that did not finish, one at a time in a one-worker pool, so the
    file that kills its worker is known and becomes a per-file error; the
    rest of the scan is complete and the same as with --jobs 1."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool: ProcessPoolExecutor | None = None
    try:
        for source, force in sorted(items, key=lambda it: it[0].path):
            if pool is None:
                pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_init_worker,
                                           initargs=initargs)
            try:
                yield from pool.submit(_process_batch, [(source, force)]).result()
            except BrokenProcessPool:
                pool.shutdown(wait=True)
                pool = None
                yield FileOutcome(source.path, "", Status.FAILED,
                                  message="the parser crashed on this file (its worker process died); not analysed")
    finally:
        if pool is not None:
            pool.shutdown(wait=True)


# ---------------------------------------------------------------- the parent's side


class Outcomes:
    """The parent's side of the per-file work: it sends files to the workers
    and keeps what the outcomes say, file by file: facts (direct sites
    classified at once: the index tells weights, T1, apart when it looks for
    buffer factories), skipped files with the names they mention, errors,
    and what the cache should learn."""

    def __init__(self, catalog: Catalog, cache: Cache, files: Sequence[SourceFile], errors: Sequence[FileError],
                 jobs: int, unchecked: Sequence[FileError] = ()) -> None:
        self._catalog = catalog
        self._tiers = catalog.tiers
        self._cache = cache
        self._jobs = jobs
        self._by_path = {f.path: f for f in files}
        self.facts: dict[str, FileFacts] = {}
        self.skipped: dict[str, str] = {}  # path -> the identifiers it mentions (expand.identifiers' text)
        self.errors: list[FileError] = list(errors)
        # files not analysed (discovery's, and failed outcomes): their sites
        # are unknown, their allowlist entries "not checked" (ScanResult.unchecked)
        self.unchecked: list[FileError] = list(unchecked)
        self.digests: dict[str, str] = {}
        self.new_skips: dict[str, tuple[str, str, str | None]] = {}  # for Cache.store_skips

    def absorb(self, outcome: FileOutcome) -> None:
        path = outcome.path
        if outcome.digest:
            self.digests[path] = outcome.digest
        if outcome.status is Status.FACTS:
            decoded = decode_facts(outcome)
            sites = classify_sites(decoded.sites, {path: decoded}, self._tiers)
            self.facts[path] = dataclasses.replace(decoded, sites=sites)
            self.skipped.pop(path, None)
        elif outcome.status is Status.SKIP:
            # one string per file, not per name: a large tree's skipped files mention ~1.5 M names (~100 MB
            # as separate strings; interned, round 35, they cost ~1 CPU s on aphrodite and more memory)
            identifiers = outcome.identifiers
            if outcome.digest and self._cache.enabled:
                key = self._cache.fact_key(path, outcome.digest, self._by_path[path].language.value)
                self.new_skips[key] = (path, identifiers, outcome.message)
            self.skipped[path] = identifiers
            if outcome.message:
                self.errors.append(FileError(path, outcome.message))
        else:
            self.errors.append(FileError(path, outcome.message or ""))
            self.unchecked.append(FileError(path, outcome.message or ""))

    def read_all(self, files: Sequence[SourceFile], digests: dict[str, str],
                 skip_table: dict[str, tuple[str, str, str | None]],
                 progress: Callable[[int, int], None] | None) -> None:
        """Every file once: those known unchanged and skipped last time from
        the skip table, the rest through the workers."""
        done = 0
        todo: list[tuple[SourceFile, bool]] = []
        outcomes: list[FileOutcome] = []
        for f in files:
            digest = digests.get(f.path)
            last = skip_table.get(self._cache.fact_key(f.path, digest, f.language.value)) if digest else None
            if last is not None and last[0] == f.path:
                outcomes.append(skipped_outcome(f.path, digest or "", last[1], last[2]))
            else:
                todo.append((f, False))
        for outcome in itertools.chain(outcomes, run_files(todo, self._catalog, self._cache, self._jobs)):
            self.absorb(outcome)
            done += 1
            if progress:
                progress(done, len(files))

    def parse(self, paths: Sequence[str]) -> None:
        """Parse ``paths`` whatever the pre-filter says (the expansion wants them)."""
        for outcome in run_files([(self._by_path[p], True) for p in paths], self._catalog, self._cache, self._jobs):
            self.absorb(outcome)

    def read(self, path: str) -> bytes:
        return read_bytes(self._by_path[path])

    def skipped_mentioning(self, name: str) -> list[bytes]:
        """The bytes of the skipped files that mention ``name``."""
        return [self.read(p) for p, names in sorted(self.skipped.items()) if mentions(names, name)]

    def size(self, path: str) -> int:
        return self._by_path[path].size

    def in_path_order(self) -> dict[str, FileFacts]:
        """The facts sorted by path: arrival order from the workers must not
        decide anything (ambiguous names resolve to the first definition)."""
        self.facts = dict(sorted(self.facts.items()))
        return self.facts
