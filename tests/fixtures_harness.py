"""Reads the expectations written into fixture files and runs alloc-audit on
them. Annotations are read with a regex over raw lines, never with the tool's
own parser, so a parser bug cannot hide itself and fixtures with syntax
errors still work (STYLE.md section 4).

An annotation is a comment alone on its line (``#`` or ``//``) and applies to
the next line that is not an annotation:

    expect: RULE               the rule reports a finding whose line is here
    ok: RULE                   the rule must not report here (a near miss)
    expect-site: API TIER [KIND]   one census site with this api and tier here
    todo-expect: RULE          should be reported, is not yet (known false negative)
    todo-ok: RULE              is reported, should not be (known false positive)
    todo-site: API TIER [KIND] a site that should be found and is not yet

Expectations are counted, not collected: two identical sites (or findings)
on one line need two annotations. ``todo-*`` lines are strict, like xfail:
one that starts passing fails until it is promoted.

A fixture is a file (scanned alone) or a directory (scanned as one project).
A ``<fixture>.toml`` next to a file, or ``alloc-audit.toml`` in a directory,
is its configuration.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import pickle
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.model import FileFacts, ScanResult
from alloc_audit.pipeline.discover import SUFFIXES
from alloc_audit.pipeline.run import ScanOptions, run_scan

FIXTURES = Path(__file__).parent / "fixtures"
ANNOTATION = re.compile(r"^\s*(?:#|//)\s*(expect|ok|expect-site|todo-expect|todo-ok|todo-site):\s*(.*?)\s*$")


Finding = tuple[str, int, str]  # (path, line, rule)
SiteKey = tuple[str, int, str, str, "str | None"]  # (path, line, api, tier, kind or None)


@dataclass
class Expectations:
    findings: Counter[Finding] = field(default_factory=Counter)
    near_misses: set[Finding] = field(default_factory=set)
    sites: list[SiteKey] = field(default_factory=list)  # one entry per expected site
    todo_findings: set[Finding] = field(default_factory=set)
    todo_ok: set[Finding] = field(default_factory=set)
    todo_sites: list[SiteKey] = field(default_factory=list)
    lines: dict[tuple[str, int], str] = field(default_factory=dict)


def read_expectations(path: Path, rel: str, into: Expectations) -> None:
    raw = path.read_bytes().decode("utf-8", "replace").splitlines()
    pending: list[tuple[str, str]] = []
    for number, text in enumerate(raw, 1):
        m = ANNOTATION.match(text)
        if m:
            pending.append((m.group(1), m.group(2)))
            continue
        into.lines[(rel, number)] = text.strip()
        for kind, arg in pending:
            if kind in ("expect-site", "todo-site"):
                parts = arg.split()
                site = (rel, number, parts[0], parts[1], parts[2] if len(parts) > 2 else None)
                (into.sites if kind == "expect-site" else into.todo_sites).append(site)
            elif kind == "expect":
                into.findings[(rel, number, arg.split()[0])] += 1
            else:
                entry = (rel, number, arg.split()[0])
                {"ok": into.near_misses, "todo-expect": into.todo_findings, "todo-ok": into.todo_ok}[kind].add(entry)
        pending = []


def fixture_cases() -> list[Path]:
    cases = []
    for language in ("python", "cpp", "cuda"):
        for entry in sorted((FIXTURES / language).iterdir()):
            if entry.is_dir() or entry.suffix in SUFFIXES:
                cases.append(entry)
    return cases


def run_fixture(case: Path) -> tuple[Expectations, ScanResult]:
    if case.is_dir():
        root, paths = case, [case]
        config_file = case / "alloc-audit.toml"
        files = sorted(p for p in case.rglob("*") if p.suffix in SUFFIXES)
    else:
        root, paths = case.parent, [case]
        config_file = case.with_suffix(".toml")
        files = [case]
    config = load_config(root, config_file if config_file.is_file() else None)
    expectations = Expectations()
    for f in files:
        read_expectations(f, f.relative_to(root).as_posix(), expectations)
    result = run_scan(config, load_catalog(config), ScanOptions(paths=tuple(paths), use_cache=False, jobs=1, complete=True))
    return expectations, result


def run_fixture_batched(case: Path, shared: Path | None = None) -> tuple[Expectations, ScanResult]:
    """``run_fixture``'s answer for a fixture, from one scan of all the
    single-file fixtures of its language folder (``_language_scan``) cut to
    the fixture's own file: its sites, findings and errors, each keyed by its
    path, which is the fixture's name in both scans (root: the language
    folder). A directory fixture (a project of its own) and a file with its
    own ``.toml`` are scanned alone, as is any fixture when the batch scan
    raised (so the failure names the fixture). The batch costs what the
    files cost, not 180 scans' start-up (catalogue, passes over an empty
    project); a file's direct sites do not depend on which other files are
    scanned (tests/test_fuzz.py holds that). Checked when this was written:
    every cut's sites, findings and errors equal its file's scan alone.
    ``shared``: a folder the xdist workers of one run share; the batch scan
    is made once there (``_shared_scan``) and read by the other workers,
    instead of once per worker whose tests include the language."""
    folder = case.parent
    if case.is_dir() or case.with_suffix(".toml").is_file() or folder.parent != FIXTURES:
        return run_fixture(case)
    batch = _language_scan(folder) if shared is None else _shared_scan(folder, shared)
    if batch is None or case.name not in batch.scanned_paths:
        return run_fixture(case)
    expectations = Expectations()
    read_expectations(case, case.name, expectations)
    own = case.name
    return expectations, dataclasses.replace(
        batch, sites=tuple(s for s in batch.sites if s.path == own),
        findings=tuple(f for f in batch.findings if f.path == own),
        errors=tuple(e for e in batch.errors if e.path == own),
        unchecked=tuple(e for e in batch.unchecked if e.path == own),
        files={k: v for k, v in batch.files.items() if k == own}, scanned_paths=frozenset((own,)))


@functools.cache
def _language_scan(folder: Path) -> ScanResult | None:
    """One scan of the single-file fixtures of ``folder`` (those without a
    ``.toml`` of their own), as ``run_fixture`` scans each: root the folder,
    its configuration, no cache, one job, complete. None when it raised."""
    files = tuple(case for case in fixture_cases()
                  if case.parent == folder and case.is_file() and not case.with_suffix(".toml").is_file())
    config = load_config(folder, None)
    try:
        return run_scan(config, load_catalog(config), ScanOptions(paths=files, use_cache=False, jobs=1, complete=True))
    except Exception:  # each fixture then runs alone and its failure names it
        return None


@functools.cache
def _shared_scan(folder: Path, shared: Path) -> ScanResult | None:
    """``_language_scan(folder)``, made by the first worker of the run that
    needs it and stored (pickled, written aside and renamed) in ``shared``;
    a worker that comes later, or waits on the lock while the first scans,
    reads that result: the same object as its own scan would be (frozen
    dataclasses, compared equal when this was written)."""
    stored = shared / f"{folder.name}.pickle"
    with open(shared / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stored.is_file():
            return pickle.loads(stored.read_bytes())  # type: ignore[no-any-return]
        result = _language_scan(folder)
        partial = stored.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        partial.rename(stored)
        return result


def reported_findings(result: ScanResult) -> Counter[Finding]:
    return Counter((f.path, f.line, f.rule) for f in result.findings if not f.suppressed)


def reported_sites(result: ScanResult) -> list[tuple[str, int, str, str, str]]:
    """One entry per site: two identical sites on a line are two entries."""
    return [(s.path, s.span.line, s.api, s.tier.value, s.kind.value) for s in result.sites]


def _matches(site: SiteKey, reported: tuple[str, int, str, str, str]) -> bool:
    return reported[:4] == site[:4] and (site[4] is None or reported[4] == site[4])


def compare_sites(expected: list[SiteKey], reported: list[tuple[str, int, str, str, str]],
                  ) -> tuple[list[str], list[str], list[tuple[str, int, str, str, str]]]:
    """Each expectation consumes one reported site (expectations may omit the
    kind; those that name it are matched first). Returns the missing
    expectations, the unexpected reports, and the unexpected reports as keys."""
    remaining = sorted(reported)
    missing = []
    for site in sorted(expected, key=lambda e: (e[4] is None, str(e))):
        match = next((r for r in remaining if _matches(site, r)), None)
        if match is None:
            path, line, api, tier, kind = site
            missing.append(f"{path}:{line}: {api} {tier} {kind or ''}")
        else:
            remaining.remove(match)
    unexpected = [f"{p}:{n}: {a} {t} {k}" for p, n, a, t, k in remaining]
    return missing, unexpected, remaining


def extracted_facts(project: Path, paths: tuple[str, ...]) -> dict[str, FileFacts]:
    """Each of ``paths`` (relative to ``project``) parsed and extracted as a
    scan would, with the project's catalogue: facts to index by hand."""
    from alloc_audit.pipeline.discover import language_of
    from alloc_audit.pipeline.extract import extract_facts
    from alloc_audit.pipeline.parse import parse_source

    apis = load_catalog(load_config(project, None)).apis
    out = {}
    for path in paths:
        lang = language_of(path)
        assert lang is not None
        parsed = parse_source((project / path).read_bytes(), lang, apis.attribute_macros, apis.specifier_macros,
                              apis.lone_macro_lines)
        out[path] = extract_facts(path, lang, parsed, apis)
    return out

