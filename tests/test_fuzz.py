"""A short deterministic slice of the fuzzer (bench/fuzz.py): 30 mutated
inputs per language, seeded from the project's own fixtures and examples,
scanned by the installed CLI with --jobs 1 and --jobs 2. No crash, traceback,
invalid JSON, hang, dropped site or --jobs difference (issue 14)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow  # run first (conftest.py)
def test_a_short_fuzz_slice_finds_no_failure(tmp_path: Path) -> None:
    fuzz = load_fuzz()
    # no second scan with --jobs 2: a batch this small (< 16 files, < 1 MB)
    # is analysed in one process whatever --jobs says, so it would repeat
    # the first; test_cache.py holds --jobs 1/2 to the same output
    tally = fuzz.fuzz(per_language=30, seed=1, extra_seeds=[], batch=30, jobs_every=0, keep=tmp_path)
    assert dict(tally.inputs) == {"python": 30, "cpp": 30, "cuda": 30}
    assert tally.sites > 0
    report = fuzz.summary(tally, 0.0, "test")
    assert tally.failures == 0, report


@pytest.mark.slow  # run first (conftest.py)
def test_a_files_sites_do_not_depend_on_the_other_files(tmp_path: Path) -> None:
    """The property behind "never silently fewer": a file's direct sites are
    the same whichever files are scanned with it, unless the file is listed
    as not analysed; a site that only callers in other files prove away
    (every caller hands in a module moved to the CPU: host_params.py) may be
    kept by a scan without those callers, never the other way round.
    Scanned: every fixture and example file, then a random half of them plus
    damaged copies."""
    import json
    import shutil

    from clihelp import run_cli

    fuzz = load_fuzz()
    rng = random.Random(3)
    sources = sorted(p for d in ("tests/fixtures", "examples") for p in (REPO / d).rglob("*")
                     if p.suffix in (".py", ".cu", ".cpp", ".h") and p.is_file())
    whole, part = tmp_path / "whole", tmp_path / "part"
    for root in (whole, part):
        root.mkdir()
        (root / "alloc-audit.toml").write_text("# property\n")
    chosen = set(rng.sample(range(len(sources)), len(sources) // 2))
    # each file keeps its place, so a fixture project's imports resolve as in
    # the project. Proofs that need a class name defined once (a stateless
    # class in a skipped file) hold in a scan of fewer files and not in one of
    # more, by design; fixtures whose proofs rest on such a name give the class
    # a name no other fixture uses.
    names = [path.relative_to(REPO).as_posix() for path in sources]
    for i, path in enumerate(sources):
        for root in (whole, part) if i in chosen else (whole,):
            (root / names[i]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, root / names[i])
    lang = {".py": "python", ".cu": "cuda"}
    for i in sorted(chosen)[:15]:  # damaged copies next to the intact files
        data, _ = fuzz.mutate(rng, sources[i].read_bytes(), lang.get(sources[i].suffix, "cpp"))
        damaged = part / names[i]
        damaged.with_name(f"damaged_{damaged.name}").write_bytes(data)

    def direct(root: Path) -> tuple[dict[str, set[tuple[int, str]]], set[str]]:
        result = run_cli("scan", "--format", "json", "--no-cache", "--jobs", "1", "--no-rules", cwd=root)
        assert result.code == 0 and "Traceback" not in result.err, result.err
        doc = json.loads(result.out)
        sites: dict[str, set[tuple[int, str]]] = {}
        for site in doc["sites"]:
            # what another file decides is left out by design: a factory without
            # a device is a site only under a default-device context some
            # caller enters, and a move is a module's when the class is one
            if site["via"] is None and "default-device context" not in site["tier_reason"]:
                sites.setdefault(site["path"], set()).add((site["line"], site["api"].replace("Module.", "Tensor.")))
        return sites, {e["path"] for e in doc["errors"] if not e["analysed"]}

    all_sites, _ = direct(whole)
    part_sites, unanalysed = direct(part)
    for i in sorted(chosen):
        name = names[i]
        if name not in unanalysed:
            assert all_sites.get(name, set()) <= part_sites.get(name, set()), name
