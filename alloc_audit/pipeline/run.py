"""Runs the stages in order and owns the per-file error boundary and the cache.

    discover -> (per file, in parallel: read, pre-filter, parse, extract)
             -> on-demand expansion -> index -> classify -> rules -> result

A file is parsed when the byte pre-filter says it can hold a site or a rule
trigger. Files that fail it are parsed later only if the rules or the derived
sites could need them (``index.expansion_wants``: they define a callee the
rules follow, or call a buffer factory; ``expand`` reads that from their
bytes), round by round up to the configured depth: the call graph gets the
files it needs without parsing the rest.

The universe of a run is the set of discovered files (the given paths, or the
whole root); ``report_paths`` narrows what is reported (``--changed-since``)
without narrowing what is analysed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from .. import __version__
from . import expand, serial
from .cache import Cache, content_digest
from ..catalog import Catalog, passes_prefilter
from .classify import classify_sites
from ..config import Config
from .discover import SourceFile, discover_files
from .expand import expansion_wants
from .index import ProjectIndex, build_index
from ..model import FileError, FileFacts, Finding, Language, Site, Tier
from .parse import error_summary, grammar_versions, parse_source

LOG = logging.getLogger("alloc_audit")
# A worker returns one of these per file.
FACTS, SKIP, FAILED = "facts", "skip", "failed"


@dataclass(frozen=True)
class ScanOptions:
    paths: tuple[Path, ...] = ()
    jobs: int | None = None
    use_cache: bool = True
    cache_dir: Path | None = None
    report_paths: frozenset[str] | None = None
    with_rules: bool = True
    progress: Callable[[int, int], None] | None = None
    # whether the paths are the whole project (unused suppressions can then
    # be told); None: only when every path is a directory
    complete: bool | None = None


@dataclass(frozen=True)
class Stats:
    files: int
    parsed: int
    parse_errors: int
    seconds: float
    lines: int = 0


@dataclass(frozen=True)
class ScanResult:
    root: Path
    sites: tuple[Site, ...]
    findings: tuple[Finding, ...]
    errors: tuple[FileError, ...]
    stats: Stats
    files: dict[str, FileFacts] = field(default_factory=dict)
    index: ProjectIndex | None = None
    scanned_paths: frozenset[str] = frozenset()

    @property
    def direct_sites(self) -> tuple[Site, ...]:
        return tuple(s for s in self.sites if s.via is None)


# ---------------------------------------------------------------- per-file work (runs in workers)

_WORKER: dict[str, Any] = {}


def _init_worker(catalog: Catalog, cache_dir: str | None, salt: str) -> None:
    _WORKER["catalog"] = catalog
    _WORKER["cache"] = Cache(Path(cache_dir) if cache_dir else None, salt)


def _process_batch(batch: Sequence[tuple[SourceFile, bool]]) -> list[tuple[str, str, str, Any, str | None]]:
    catalog: Catalog = _WORKER["catalog"]
    cache: Cache = _WORKER["cache"]
    return [process_file(source, catalog, cache, force) for source, force in batch]


def process_file(source: SourceFile, catalog: Catalog, cache: Cache,
                 force: bool = False) -> tuple[str, str, str, Any, str | None]:
    """Read, pre-filter, parse and extract one file. Never raises for a bad
    file (the per-file error boundary, STYLE.md section 6).

    Returns (path, digest, status, payload, warning): status FACTS with the
    encoded facts, SKIP with the file's identifiers (for on-demand
    expansion), or FAILED with a message. ``force`` parses even when the
    pre-filter would skip (a file wanted by the expansion)."""
    try:
        with open(source.abspath, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return source.path, "", FAILED, f"cannot read: {exc.strerror}", None
    digest = content_digest(data)
    try:
        return (source.path, digest, *_facts_or_skip(source, data, digest, catalog, cache, force))
    except Exception as exc:  # the only catch-all (STYLE.md section 6)
        LOG.debug("internal error on %s", source.path, exc_info=True)
        return source.path, digest, FAILED, f"internal error ({type(exc).__name__}): {exc}", None


def _facts_or_skip(source: SourceFile, data: bytes, digest: str, catalog: Catalog, cache: Cache,
                   force: bool) -> tuple[str, Any, str | None]:
    # a forced parse has its own key, so a file parsed on demand is still a
    # skip in the next run's first pass: cold and warm runs stay identical
    key = cache.fact_key(source.path, digest, source.language.value + ("+forced" if force else ""))
    cached = cache.load(key)
    if cached is not None:
        return cached[0], cached[1], cached[2]
    if b"\0" in data[:8192]:
        return SKIP, (), "binary content (a NUL byte in the first 8 KiB); skipped"
    warning = None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        warning = (f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at line {line}); "
                   "read as bytes, texts may show replacement characters")
    needles = catalog.py_needles if source.language is Language.PYTHON else catalog.cpp_needles
    aliasable = catalog.py_aliasable if source.language is Language.PYTHON else frozenset()
    if not force and not passes_prefilter(data, needles, aliasable):
        # What the on-demand expansion asks of a skipped file first: the
        # names it mentions (see expand.py); Python files are also wanted
        # by module name. Cached by the parent, in one table (Cache.load_skips).
        return SKIP, expand.identifiers(data), warning
    apis = catalog.apis
    parsed = parse_source(data, source.language, apis.attribute_macros, apis.specifier_macros,
                          apis.lone_macro_lines)
    from .extract import extract_facts  # imported here: workers load it once

    facts = extract_facts(source.path, source.language, parsed, apis)
    problem = error_summary(parsed)
    errors = tuple(e for e in (warning, problem) if e)
    facts = _with(facts, digest=digest, errors=errors)
    encoded = serial.encode(facts)
    cache.store(key, (FACTS, encoded, None))
    return FACTS, encoded, None


def _read_bytes(source: SourceFile) -> bytes:
    """A skipped file's bytes, read again for the expansion; empty when it
    cannot be read (it was read a moment ago: its error is reported then)."""
    try:
        with open(source.abspath, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _with(facts: FileFacts, **changes: Any) -> FileFacts:
    return dataclasses.replace(facts, **changes)


# ---------------------------------------------------------------- the run


def _source_digest() -> str:
    """A digest of this package's own code: an editable install changes
    behaviour without changing the version, and must not read stale facts."""
    h = hashlib.blake2b(digest_size=8)
    base = Path(__file__).resolve().parent.parent  # the package
    for path in sorted(base.rglob("*.py")):
        try:
            h.update(path.read_bytes())
        except OSError:
            continue
    return h.hexdigest()


def _cache_for(config: Config, catalog: Catalog, options: ScanOptions) -> Cache:
    salt = "|".join((__version__, _source_digest(), serial.schema_digest(FileFacts), serial.schema_digest(Finding),
                     catalog.digest, grammar_versions(), sys.version.split()[0]))
    if not options.use_cache:
        return Cache(None, salt)
    directory = options.cache_dir or (config.root / config.cache_dir)
    return Cache(directory, salt)


def _jobs(options: ScanOptions, config: Config) -> int:
    if options.jobs:
        return max(1, options.jobs)
    if config.jobs:
        return config.jobs
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


def _run_files(items: list[tuple[SourceFile, bool]], catalog: Catalog, cache: Cache,
               jobs: int) -> Iterator[tuple[str, str, str, Any, str | None]]:
    """Outcomes as they complete (order is not kept: callers sort). The
    parent consumes them while the workers go on parsing."""
    total_bytes = sum(s.size for s, _ in items)
    if jobs <= 1 or len(items) < 16 or total_bytes < 1_000_000:
        for source, force in items:
            yield process_file(source, catalog, cache, force)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    cache_dir = str(cache.directory) if cache.enabled and cache.directory is not None else None
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_init_worker,
                             initargs=(catalog, cache_dir, cache.salt)) as pool:
        futures = [pool.submit(_process_batch, batch) for batch in _batches(items, jobs)]
        from concurrent.futures import as_completed

        for future in as_completed(futures):
            yield from future.result()


def _result_key(cache: Cache, config: Config, catalog: Catalog, files: Sequence[SourceFile],
                digests: dict[str, str], with_rules: bool, skipped: Sequence[FileError] = ()) -> str:
    h = hashlib.blake2b(digest_size=20)
    h.update(cache.salt.encode())
    # the files discovery reported (too large, a named link or FIFO) are part of the stored result
    h.update(repr(sorted((e.path, e.message) for e in skipped)).encode())
    h.update(repr((catalog.tiers, config.enable, config.disable, config.severity, with_rules,
                   config.max_file_size)).encode())
    for f in files:
        h.update(f"{f.path}\0{digests[f.path]}\n".encode())
    return h.hexdigest()


class _Phases:
    """Wall time per phase, logged at debug level (``--debug``)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        LOG.debug("phase %-12s %.3f s", name, now - self.last)
        self.last = now


def run_scan(config: Config, catalog: Catalog, options: ScanOptions = ScanOptions()) -> ScanResult:
    started = time.perf_counter()
    phases = _Phases()
    discovery = discover_files(config, options.paths)
    files = list(discovery.files)
    cache = _cache_for(config, catalog, options)
    root_key = hashlib.blake2b(str(config.root.resolve()).encode(), digest_size=8).hexdigest()
    stat_table = cache.load_stat(root_key)

    # Warm path: when every file's stat is unchanged, the digests are known
    # without reading, and a stored result for exactly these inputs is reused.
    digests: dict[str, str] = {}
    for f in files:
        known = stat_table.get(f.path)
        if known is not None and known[:3] == (f.size, f.mtime_ns, f.inode):
            digests[f.path] = known[3]
    misses = [f for f in files if f.path not in digests]
    if cache.enabled and len(misses) <= max(8, len(files) // 20):
        # few files changed on disk (or were only touched): hash them here,
        # a whole run's result may still be stored for exactly this content
        for f in misses:
            try:
                with open(f.abspath, "rb") as fh:
                    digests[f.path] = content_digest(fh.read())
            except OSError:
                break
    if cache.enabled and len(digests) == len(files):
        key = _result_key(cache, config, catalog, files, digests, options.with_rules, discovery.errors)
        stored = cache.load_result(key)
        if stored is not None:
            result = _decode_result(stored, config.root, time.perf_counter() - started)
            if misses:
                table = dict(stat_table)
                table.update({f.path: (f.size, f.mtime_ns, f.inode, digests[f.path]) for f in misses})
                cache.store_stat(root_key, table)
            return _narrow(result, options.report_paths)

    total = len(files)
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if options.progress:
            options.progress(done[0], total)

    jobs = _jobs(options, config)
    by_path = {f.path: f for f in files}
    facts: dict[str, FileFacts] = {}
    skipped: dict[str, tuple[str, ...]] = {}  # path -> the identifiers it mentions
    errors: list[FileError] = list(discovery.errors)
    new_digests: dict[str, str] = {}
    skip_table = cache.load_skips(root_key) if cache.enabled else {}
    new_skips: dict[str, tuple[str, tuple[str, ...], str | None]] = {}

    def absorb(outcome: tuple[str, str, str, Any, str | None]) -> None:
        path, digest, status, payload, warning = outcome
        if digest:
            new_digests[path] = digest
        if status == SKIP and digest and cache.enabled:
            new_skips[cache.fact_key(path, digest, by_path[path].language.value)] = (path, payload, warning)
        if status == FACTS:
            decoded = serial.decode(FileFacts, payload)
            # classify direct sites now: the index tells weights (T1) apart
            # when it looks for buffer factories
            sites = classify_sites(decoded.sites, {path: decoded}, catalog.tiers)
            facts[path] = dataclasses.replace(decoded, sites=sites)
            skipped.pop(path, None)
        elif status == SKIP:
            skipped[path] = payload
            if warning:
                errors.append(FileError(path, warning))
        else:
            errors.append(FileError(path, payload))

    # files known unchanged and skipped last time need no worker
    todo: list[tuple[SourceFile, bool]] = []
    for f in files:
        digest = digests.get(f.path)
        last = skip_table.get(cache.fact_key(f.path, digest, f.language.value)) if digest else None
        if last is not None and last[0] == f.path:
            absorb((f.path, digest or "", SKIP, last[1], last[2]))
            tick(1)
        else:
            todo.append((f, False))
    for outcome in _run_files(todo, catalog, cache, jobs):
        absorb(outcome)
        tick(1)
    phases.mark("files")

    # On-demand expansion: parse skipped files that define a callee the rules
    # follow, or mention a buffer factory, until nothing new is wanted.
    # the index is built in path order: arrival order from the workers must
    # not decide anything (ambiguous names resolve to the first definition)
    facts = dict(sorted(facts.items()))
    index = build_index(facts)
    phases.mark("index")
    if options.with_rules and skipped:
        from ..rules import root_finder

        pack = catalog.pack
        roots = root_finder(pack)
        depth = max(pack.capture_depth, pack.flow_depth, 1)
        looks: dict[str, expand.SkippedFile] = {}  # skipped files read again, once

        def look(path: str) -> expand.SkippedFile:
            found = looks.get(path)
            if found is None:
                found = looks[path] = expand.SkippedFile(functools.partial(_read_bytes, by_path[path]))
            return found

        for _round in range(depth):
            asked = time.perf_counter()
            wants = expansion_wants(index, roots, depth)
            chosen = sorted(p for p, idents in skipped.items()
                            if wants.wants_file(p, idents, functools.partial(look, p)))
            LOG.debug("expansion round %d: %d of %d skipped files wanted (%d bytes; chosen in %.3f s)", _round + 1,
                      len(chosen), len(skipped), sum(by_path[p].size for p in chosen), time.perf_counter() - asked)
            if not chosen:
                break
            before = set(facts)
            for outcome in _run_files([(by_path[p], True) for p in chosen], catalog, cache, jobs):
                absorb(outcome)
            for p in chosen:
                skipped.pop(p, None)
            index.add({p: facts[p] for p in sorted(facts) if p not in before})
        facts = dict(sorted(facts.items()))
    phases.mark("expansion")
    for path, parsed_facts in facts.items():
        errors.extend(FileError(path, e) for e in parsed_facts.errors)

    sites = [s for f in facts.values() for s in f.sites]
    sites += _owner_tiers(classify_sites(index.derived_sites(), facts, catalog.tiers), sites)
    sites.sort(key=lambda s: (s.sort_key, s.via is not None))
    phases.mark("sites")
    findings: tuple[Finding, ...] = ()
    if options.with_rules:
        from ..rules import enabled_names, known_rule_names, run_rules
        from .suppress import apply_suppressions

        findings = run_rules(index, catalog.pack, config, tuple(sites))
        complete = options.complete if options.complete is not None else all(Path(p).is_dir() for p in options.paths)
        findings = apply_suppressions(findings, facts, sites, known_rule_names(), enabled_names(config), complete)
        phases.mark("rules")
    stats = Stats(
        files=len(files),
        parsed=len(facts),
        parse_errors=sum(1 for f in facts.values() if any(not e.startswith("not valid UTF-8") for e in f.errors)),
        seconds=time.perf_counter() - started,
        lines=sum(f.lines_of_code for f in facts.values()),
    )
    result = ScanResult(
        root=config.root,
        sites=tuple(sites),
        findings=tuple(sorted(findings, key=lambda f: f.sort_key)),
        errors=tuple(sorted(set(errors), key=lambda e: (e.path, e.message))),
        stats=stats,
        files=facts,
        index=index,
        scanned_paths=frozenset(f.path for f in files),
    )
    if cache.enabled:
        table = {f.path: (f.size, f.mtime_ns, f.inode, new_digests[f.path]) for f in files if f.path in new_digests}
        # keep entries of files outside this run's paths
        for path, entry in stat_table.items():
            table.setdefault(path, entry)
        cache.store_stat(root_key, table)
        # keep the skipped files of paths outside this run
        ours = {f.path for f in files}
        for fact_key, skip in skip_table.items():
            if skip[0] not in ours:
                new_skips.setdefault(fact_key, skip)
        cache.store_skips(root_key, new_skips)
        if len(new_digests) == len(files):
            key = _result_key(cache, config, catalog, files, new_digests, options.with_rules, discovery.errors)
            cache.store_result(key, _encode_result(result))
        cache.prune()
    phases.mark("store")
    return _narrow(result, options.report_paths)


def _owner_tiers(derived: Iterable[Site], direct: Sequence[Site]) -> list[Site]:
    """A derived site whose memory is pooled (T3: a KV cache or state pool
    constructed anywhere) keeps that tier: the owner decides the lifetime."""
    tiers = {(s.path, s.span.line): s for s in direct}
    out = []
    for site in derived:
        under = tiers.get((site.via.path, site.via.line)) if site.via else None
        if under is not None and under.tier is Tier.T3 and site.tier is not Tier.T3:
            site = dataclasses.replace(site, tier=Tier.T3, tier_reason=(
                f"constructs {site.api}: pooled memory ({under.api} at {under.path}:{under.span.line} is T3)"))
        out.append(site)
    return out


def _narrow(result: ScanResult, report_paths: frozenset[str] | None) -> ScanResult:
    if report_paths is None:
        return result
    keep = report_paths
    return dataclasses.replace(
        result,
        sites=tuple(s for s in result.sites if s.path in keep),
        findings=tuple(f for f in result.findings if f.path in keep),
        errors=tuple(e for e in result.errors if e.path in keep),
        scanned_paths=result.scanned_paths & keep,
    )


def _encode_result(result: ScanResult) -> Any:
    return (
        tuple(serial.encode(s) for s in result.sites),
        tuple(serial.encode(f) for f in result.findings),
        tuple(serial.encode(e) for e in result.errors),
        (result.stats.files, result.stats.parsed, result.stats.parse_errors, result.stats.lines),
        tuple(sorted(result.scanned_paths)),
    )


def _decode_result(stored: Any, root: Path, seconds: float) -> ScanResult:
    sites, findings, errors, stats, scanned = stored
    return ScanResult(
        root=root,
        sites=tuple(serial.decode(Site, s) for s in sites),
        findings=tuple(serial.decode(Finding, f) for f in findings),
        errors=tuple(serial.decode(FileError, e) for e in errors),
        stats=Stats(files=stats[0], parsed=stats[1], parse_errors=stats[2], seconds=seconds, lines=stats[3]),
        scanned_paths=frozenset(scanned),
    )


def changed_files(root: Path, ref: str) -> frozenset[str]:
    """Files changed between ``ref`` and the work tree (committed, staged,
    unstaged and untracked), relative to ``root``."""
    from ..gitio import changed_since

    return changed_since(root, ref)


def iter_sites(result: ScanResult, direct: bool = True) -> Iterable[Site]:
    return (s for s in result.sites if (s.via is None) == direct)
