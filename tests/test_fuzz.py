"""A short deterministic slice of the fuzzer (bench/fuzz.py): 30 mutated
inputs per language, seeded from the project's own fixtures and examples,
scanned by the installed CLI with --jobs 1 and --jobs 2. No crash, traceback,
invalid JSON, hang, dropped site or --jobs difference (issue 14)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_fuzz():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("alloc_audit_fuzz", REPO / "bench" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_mutations_are_deterministic_and_change_the_input() -> None:
    fuzz = load_fuzz()
    seed = (REPO / "tests" / "fixtures" / "cuda" / "alloc-in-capture.cu").read_bytes()
    first = [fuzz.mutate(random.Random(7), seed, "cuda") for _ in range(3)]
    again = [fuzz.mutate(random.Random(7), seed, "cuda") for _ in range(3)]
    assert first == again
    changed = [fuzz.mutate(random.Random(i), seed, "cuda")[0] != seed for i in range(20)]
    assert sum(changed) >= 18


def test_a_short_fuzz_slice_finds_no_failure(tmp_path: Path) -> None:
    fuzz = load_fuzz()
    tally = fuzz.fuzz(per_language=30, seed=1, extra_seeds=[], batch=30, jobs_every=1, keep=tmp_path)
    assert dict(tally.inputs) == {"python": 30, "cpp": 30, "cuda": 30}
    assert tally.sites > 0
    report = fuzz.summary(tally, 0.0, "test")
    assert tally.failures == 0, report
