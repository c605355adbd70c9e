"""Runs the stages in order.

    discover -> (per file, in parallel, ``workers``: read, pre-filter, parse, extract)
             -> on-demand expansion -> index -> derive + classify -> rules -> suppress -> result

A file is parsed when the byte pre-filter says it can hold a site or a rule
trigger. Files that fail it are parsed later only if the rules or the derived
sites could need them (``expand.expansion_wants``: they define a callee the
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
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import __version__
from ..errors import UsageError
from ..model import FileError, FileFacts, Finding, ScanResult, Site, Stats
from . import serial
from .background import Background
from .cache import Cache, RunCache, grammar_versions, result_key
from .discover import discover_files

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..config import Config
    from .index import ProjectIndex

LOG = logging.getLogger("alloc_audit")


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


def run_scan(config: Config, catalog: Catalog, options: ScanOptions = ScanOptions()) -> ScanResult:
    started = time.perf_counter()
    phases = _Phases()
    discovery = discover_files(config, options.paths)
    files = list(discovery.files)
    run_cache = RunCache(_cache_for(config, catalog, options), config.root)
    cache = run_cache.cache
    # what discovery reported (too large, a named link or FIFO) is part of the stored result
    inputs = (catalog.tiers, catalog.callers, sorted(catalog.stateless_modules),
              config.enable, config.disable, config.severity, options.with_rules,
              config.max_file_size, config.roles, sorted((e.path, e.message) for e in discovery.errors))
    digests, misses = run_cache.known_digests(files)
    if cache.enabled and len(digests) == len(files):
        stored = run_cache.stored_result(result_key(cache, inputs, files, digests), files, digests, misses,
                                         config.root, time.perf_counter() - started)
        if stored is not None:
            return _narrow(stored, options.report_paths)
    # the stages load here: a run the stored result answers (the warm `check`) does not pay for importing them
    from .adopted_weights import adopted_weights
    from .bound_init import bound_per_step
    from .buffer_classes import buffer_classes
    from .built_per_call import built_per_call
    from .built_per_pass import built_per_pass
    from .caller_lifetimes import caller_lifetimes
    from .checkpoint_reads import checkpoint_uploads
    from .classify import classify_sites
    from .classify_callers import tiers_from_callers, tiers_of_derived
    from .closure_kept import closure_kept
    from .conversion_paths import conversion_paths
    from .cpu_locals import drop_cpu_locals
    from .default_device import promote_default_sites
    from .derive import derive_sites
    from .dropped_objects import dropped_objects
    from .dropped_probes import dropped_probes
    from .empty_moves import drop_empty_moves
    from .expand import expand_skipped
    from .expected_raises import drop_expected_raises
    from .fixture_scoped import fixture_scoped
    from .grown_params import grown_params
    from .guarded_setup import guarded_setup
    from .hook_closures import hook_closures
    from .hooked_state import hooked_state
    from .host_args import drop_host_args
    from .host_params import drop_host_param_moves
    from .host_reads import host_reads
    from .host_returns import drop_host_returns
    from .index import build_index
    from .kept_accumulators import kept_accumulators
    from .kept_pinned import kept_pinned
    from .kept_results import kept_results
    from .kept_returns import kept_returns
    from .kept_slots import kept_slots
    from .kept_submodules import kept_submodules
    from .keyed_caches import keyed_caches
    from .lazy_members import lazy_members
    from .lifetimes import decided_by_use
    from .local_objects import local_objects
    from .lookup_temps import lookup_temps
    from .model_constants import model_constants
    from .module_build_temps import module_build_temps
    from .module_classes import module_moves
    from .module_state import module_state
    from .moved_again import drop_moved_again
    from .native_pinned import native_pinned
    from .native_uploads import native_uploads
    from .native_weight_members import native_weight_members
    from .object_moves import object_moves
    from .parameter_uploads import parameter_uploads
    from .per_pass_storage import per_pass_storage
    from .per_test_holders import per_test_holders
    from .pin_flags import unpinned_flags
    from .pinned_containers import pinned_containers
    from .placed_modules import drop_placed_moves
    from .placed_returns import drop_placed_return_moves
    from .rebound_stores import rebound_stores
    from .rebuilt_members import rebuilt_members
    from .registered_members import registered_members
    from .released_entries import released_entries
    from .removed_hooks import removed_hooks
    from .repinned_members import repinned_members
    from .reset_members import reset_members
    from .returned_once import returned_once
    from .returned_scratch import returned_scratch
    from .roles import with_roles
    from .run_accumulators import run_accumulators
    from .run_once import run_once
    from .same_device_moves import drop_gpu_return_moves, drop_same_device_moves
    from .script_intermediates import script_intermediates
    from .self_moves import self_moves
    from .setup_members import setup_members
    from .setup_uploads import setup_uploads
    from .slab_caches import slab_caches
    from .stateless_modules import drop_stateless_moves
    from .swapped_storage import swapped_storage
    from .teardown_releases import kept_until_teardown, teardown_releases
    from .timed_buffers import timed_buffers
    from .weight_fills import weight_fills
    from .weight_holders import weight_holders
    from .weight_inits import weight_init_temporaries
    from .weight_members import weight_members
    from .weight_modules import weight_module_constructions, weighted_vias
    from .weight_preparation import weight_preparation
    from .weight_state import weight_state
    from .worker_buffers import worker_buffers
    from .workers import Outcomes, job_count

    outcomes = Outcomes(catalog, cache, files, discovery.errors, job_count(options.jobs, config.jobs),
                        discovery.unchecked)
    skip_table = run_cache.skip_table()
    run_cache.hash_skipped(misses, digests, skip_table)
    outcomes.read_all(files, digests, skip_table, options.progress)
    phases.mark("files")
    index = build_index(outcomes.in_path_order())
    phases.mark("index")
    if options.with_rules and outcomes.skipped:
        expand_skipped(index, outcomes, catalog.pack, catalog.apis.py_device_contexts)
    facts = outcomes.in_path_order()
    phases.mark("expansion")
    # factories without a device that run under a default-device context
    promoted = classify_sites(promote_default_sites(index, facts, catalog.apis.py_device_contexts,
                                                          catalog.apis.py_loader_engines), facts,
                              catalog.tiers)
    if promoted:
        index.add_sites(promoted)
        facts = {path: index.files.get(path, f) for path, f in facts.items()}
    index.settle()  # nothing is added from here on: the memos drop what kept them across rounds
    phases.mark("default-device")
    # the rules read the settled index only: a child runs them while this process runs the tier passes
    # (one job: this process runs them now, from the same index)
    jobs = job_count(options.jobs, config.jobs)
    rules = Background(functools.partial(_rules, index, config, catalog), concurrent=jobs > 1) \
        if options.with_rules else None
    errors = outcomes.errors + [FileError(path, e) for path, f in facts.items() for e in f.errors]
    direct = host_reads(hook_closures([s for f in facts.values() for s in f.sites], index), index)
    sites = drop_stateless_moves(module_moves(direct, index, facts, catalog.tiers, outcomes.skipped_mentioning),
                                 index, catalog.stateless_modules, outcomes.skipped_mentioning)
    sites = drop_empty_moves(object_moves(drop_placed_moves(sites, index), index, facts, catalog.tiers), index)
    sites = unpinned_flags(sites, index, facts, catalog.tiers)
    sites = drop_host_param_moves(drop_host_returns(drop_cpu_locals(sites, index), index), index)
    sites = drop_host_args(sites, index)
    sites = drop_moved_again(drop_gpu_return_moves(drop_same_device_moves(sites, index), index), index)
    sites = tiers_from_callers(sites, index, catalog.callers)
    sites = dropped_objects(built_per_call(sites, index, catalog.callers), index)
    sites = lookup_temps(weight_init_temporaries(sites, index, catalog.callers), index, catalog.callers,
                         catalog.apis.py_non_retaining)
    sites = bound_per_step(checkpoint_uploads(sites, index, catalog.callers), index, catalog.callers)
    sites = kept_returns(built_per_pass(module_state(sites, index), index), index, catalog.callers)
    derived = tiers_of_derived(derive_sites(index, facts, catalog.tiers, sites, catalog.apis, catalog.callers), sites,
                               index, catalog.callers)
    # no-op moves leave after derive: the constructions and their tiers read them as before
    sites = drop_placed_return_moves(sites, index)
    sites += per_test_holders(built_per_call(derived, index, catalog.callers), index)
    sites = native_uploads(weight_module_constructions(
        kept_submodules(sites, index, catalog.callers), index, catalog.callers), index)
    sites = script_intermediates(decided_by_use(sites, index), index)
    sites = per_pass_storage(pinned_containers(released_entries(sites, index), index), index)
    sites = returned_scratch(weight_fills(sites, index, catalog.callers), index)
    sites = grown_params(lazy_members(sites, index), index)
    sites = setup_uploads(run_once(self_moves(sites, index), index), index)
    sites = weight_state(keyed_caches(guarded_setup(sites, index), index), index)
    sites = kept_accumulators(run_accumulators(sites, index, catalog.callers), index, catalog.callers)
    sites = timed_buffers(sites, index)
    sites = kept_results(sites, index, catalog.callers)
    sites = fixture_scoped(registered_members(caller_lifetimes(sites, index, catalog.callers), index), index)
    sites = closure_kept(returned_once(sites, index, catalog.callers), index, catalog.callers)
    sites = adopted_weights(module_build_temps(sites, index), index)
    sites = repinned_members(native_pinned(kept_slots(sites, index, catalog.callers), index), index, catalog.callers)
    sites = worker_buffers(local_objects(setup_members(sites, index, catalog.callers), index), index)
    sites = weight_holders(weight_members(buffer_classes(kept_pinned(sites, index)), index), index)
    sites = native_weight_members(sites, index)
    sites = weighted_vias(parameter_uploads(model_constants(sites, index), index), index, catalog.callers)
    sites = slab_caches(dropped_probes(sites, index), index)
    sites = rebuilt_members(reset_members(sites, index, catalog.callers), index, catalog.callers)
    sites = weight_preparation(conversion_paths(sites, index, catalog.callers), index, catalog.callers)
    sites = removed_hooks(swapped_storage(hooked_state(sites, index), index), index)
    sites = teardown_releases(kept_until_teardown(sites, index), index)
    sites = rebound_stores(sites, index)
    sites = with_roles(drop_expected_raises(sites, index), config.roles)
    sites.sort(key=lambda s: (s.sort_key, s.via is not None))
    phases.mark("sites")
    findings = _findings(rules.result(), facts, sites, config, options) if rules is not None else ()
    phases.mark("rules")
    result = ScanResult(
        root=config.root,
        sites=tuple(sites),
        findings=tuple(sorted(findings, key=lambda f: f.sort_key)),
        errors=tuple(sorted(set(errors), key=lambda e: (e.path, e.message))),
        stats=_stats(files, facts, time.perf_counter() - started),
        files=facts,
        scanned_paths=frozenset(f.path for f in files),
        unchecked=tuple(sorted(set(outcomes.unchecked), key=lambda e: (e.path, e.message))),
    )
    every_file_read = len(outcomes.digests) == len(files)
    run_cache.store(files, outcomes.digests, outcomes.new_skips, skip_table,
                    result_key(cache, inputs, files, outcomes.digests) if every_file_read else None, result)
    phases.mark("store")
    return _narrow(result, options.report_paths)


def _rules(index: ProjectIndex, config: Config, catalog: Catalog) -> tuple[Finding, ...]:
    """Stage 6: the enabled rules (on the settled index; see ``background``)."""
    from ..rules import run_rules

    return run_rules(index, catalog.pack, config)


def _findings(findings: tuple[Finding, ...], facts: dict[str, FileFacts], sites: list[Site], config: Config,
              options: ScanOptions) -> tuple[Finding, ...]:
    """Stage 7: the inline suppressions and the meta findings, on the rules' findings."""
    from ..rules import enabled_names, known_rule_names
    from .suppress import apply_suppressions

    complete = options.complete if options.complete is not None else all(Path(p).is_dir() for p in options.paths)
    return apply_suppressions(findings, facts, sites, known_rule_names(), enabled_names(config), complete)


def _stats(files: Sequence[object], facts: dict[str, FileFacts], seconds: float) -> Stats:
    return Stats(
        files=len(files),
        parsed=len(facts),
        parse_errors=sum(1 for f in facts.values() if any(not e.startswith("not valid UTF-8") for e in f.errors)),
        seconds=seconds,
        lines=sum(f.lines_of_code for f in facts.values()),
    )


@functools.cache
def _source_digest() -> str:
    """A digest of this package's own code: an editable install changes
    behaviour without changing the version, and must not read stale facts.
    Once per process (the code a process runs is the code it loaded)."""
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
    if directory.exists() and not directory.is_dir():
        raise UsageError("the cache directory is not a directory (give --cache-dir a directory, or --no-cache)",
                         str(directory))
    return Cache(directory, salt)


class _Phases:
    """Wall time per phase, logged at debug level (``--debug``)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        LOG.debug("phase %-12s %.3f s", name, now - self.last)
        self.last = now


def _narrow(result: ScanResult, report_paths: frozenset[str] | None) -> ScanResult:
    """Report only ``report_paths`` (``--changed-since``); the analysis saw everything."""
    if report_paths is None:
        return result
    keep = report_paths
    return dataclasses.replace(
        result,
        sites=tuple(s for s in result.sites if s.path in keep),
        findings=tuple(f for f in result.findings if f.path in keep),
        errors=tuple(e for e in result.errors if e.path in keep),
        scanned_paths=result.scanned_paths & keep,
        unchecked=tuple(e for e in result.unchecked if e.path in keep),
    )
