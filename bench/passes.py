"""CPU seconds of the whole-project stages and of each tier pass of `scan`,
one process (`--jobs 1`), with the per-file facts answered from a cache and
the stored result disabled, so every stage after the per-file work runs;
the rules run in this process (not in a forked child), so `_rules` and the
whole scan count them.

    python bench/passes.py ROOT [--cache DIR] [--runs N]

ROOT is a project (the command runs there; the tree is never written: the
cache goes to DIR, default a temporary directory filled by a first run). The
code measured is whatever `alloc_audit` imports: the code before a change with
`PYTHONPATH=` a `git archive` of it. Each stage is timed by wrapping its
function (`time.process_time`, so nested stages count in both: `derive_sites`
holds `drop_host_moves`); the minimum over the runs is printed.

The source digest of the package (part of the cache key) is fixed for the
run, so two checkouts whose extraction is the same can share a filled cache.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

STAGES = [("index", "build_index"), ("expand", "expand_skipped"), ("default_device", "promote_default_sites"),
          ("module_classes", "module_moves"), ("cpu_locals", "drop_cpu_locals"),
          ("classify_callers", "tiers_from_callers"), ("checkpoint_reads", "checkpoint_uploads"),
          ("bound_init", "bound_per_step"), ("module_state", "module_state"), ("built_per_pass", "built_per_pass"),
          ("derive", "derive_sites"), ("host_moves", "drop_host_moves"), ("untaken", "drop_untaken"),
          ("classify_callers", "tiers_of_derived"), ("lifetimes", "decided_by_use"), ("weight_fills", "weight_fills"),
          ("returned_scratch", "returned_scratch"), ("lazy_members", "lazy_members"), ("run_once", "run_once"),
          ("kept_results", "kept_results"), ("caller_lifetimes", "caller_lifetimes"),
          ("registered_members", "registered_members"), ("fixture_scoped", "fixture_scoped"), ("roles", "with_roles"),
          ("native_modules", "native_module_state"), ("kept_stores", "stored_later"),
          ("weight_inits", "weight_init_temporaries"), ("kept_submodules", "kept_submodules"),
          ("keyed_caches", "keyed_caches"), ("weight_state", "weight_state"),
          ("buffer_classes", "buffer_classes"), ("per_test_holders", "per_test_holders"),
          ("returned_once", "returned_once"), ("module_build_temps", "module_build_temps"),
          ("lookup_temps", "lookup_temps"), ("self_moves", "self_moves"), ("run_accumulators", "run_accumulators"),
          ("adopted_weights", "adopted_weights"), ("kept_slots", "kept_slots"), ("kept_pinned", "kept_pinned"),
          ("dispatched", "per_step_reader"), ("module_returns", "returns_module"), ("run", "_rules"),
          ("run", "_findings"), ("conversion_paths", "conversion_paths"), ("weight_preparation", "weight_preparation"),
          ("slab_caches", "slab_caches"), ("reset_members", "reset_members"), ("built_per_call", "built_per_call"),
          ("dropped_objects", "dropped_objects"), ("host_args", "drop_host_args"), ("hooked_state", "hooked_state"),
          ("removed_hooks", "removed_hooks"), ("kept_returns", "kept_returns")]


def _wrap(times: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            times[name] += time.process_time() - start
    return timed


def instrument(times: dict[str, float]) -> None:
    """Wrap every stage wherever it is looked up: its module, and every module of the package that imported
    it by name, under any alias (a stage the code measured does not have is left out)."""
    modules = {}
    for module, _ in STAGES:
        try:
            modules[module] = importlib.import_module(f"alloc_audit.pipeline.{module}")
        except ImportError:
            continue
    for module in ("run", "derive"):
        importlib.import_module(f"alloc_audit.pipeline.{module}")
    users = [m for n, m in sys.modules.items() if n.startswith("alloc_audit.") and m is not None]
    for module, name in STAGES:
        original = getattr(modules.get(module), name, None)
        if original is None:
            continue
        timed = _wrap(times, name, original)
        setattr(modules[module], name, timed)
        for user in users:
            for alias, value in list(vars(user).items()):
                if value is original:
                    setattr(user, alias, timed)


def scan(root: str, cache: str, jobs: int) -> float:
    from alloc_audit.cli import app

    argv, out, cwd = sys.argv, sys.stdout, os.getcwd()
    sys.argv = ["alloc-audit", "scan", ".", "--jobs", str(jobs), "--format", "json", "--cache-dir", cache]
    start = time.process_time()
    try:
        os.chdir(root)
        with open(os.devnull, "w") as sys.stdout:
            app(prog_name="alloc-audit")
    except SystemExit:
        pass
    finally:
        sys.argv, sys.stdout = argv, out
        os.chdir(cwd)
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--cache", default=None, help="a cache directory (filled by a first run when empty)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from alloc_audit.pipeline import cache as cache_module
    from alloc_audit.pipeline import run

    gc.set_threshold(300_000, 20, 10)  # as the console script (`__main__.entry`) runs a scan

    run._source_digest = lambda: "bench/passes.py"  # type: ignore[attr-defined]
    try:  # the rules in this process, not a forked child, so that their CPU counts (`_rules`)
        from alloc_audit.pipeline import background
        background.can_fork = lambda: False  # type: ignore[attr-defined]
    except ImportError:
        pass
    cache = args.cache or tempfile.mkdtemp(prefix="alloc-audit-passes-")
    os.makedirs(cache, exist_ok=True)
    if not os.listdir(cache):
        scan(args.root, cache, 2)  # facts (and a stored result, which the runs below ignore)
    cache_module.RunCache.stored_result = lambda self, *a, **k: None  # type: ignore[method-assign]
    cache_module.RunCache.store = lambda self, *a, **k: None  # type: ignore[method-assign]
    times: dict[str, float] = collections.defaultdict(float)
    instrument(times)
    best: dict[str, float] = {}
    for _ in range(args.runs):
        times.clear()
        total = scan(args.root, cache, 1)
        for name, seconds in [*times.items(), ("whole scan (process CPU)", total)]:
            best[name] = min(best.get(name, seconds), seconds)
    load = os.getloadavg()
    print(f"| stage (CPU s, min of {args.runs}; load {load[0]:.1f}) | |\n|---|--:|")
    for _, name in STAGES:
        if name in best:
            print(f"| {name} | {best[name]:.3f} |")
    print(f"| whole scan (process CPU) | {best['whole scan (process CPU)']:.3f} |")


if __name__ == "__main__":
    main()
