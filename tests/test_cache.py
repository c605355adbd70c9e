"""The content-hash cache and the process pool, through the real CLI:
invalidation on content, catalogue and tool-version change; identical output
for --jobs 1 and 2, cold and warm; a killed run leaves a usable cache; two
concurrent runs agree. Nothing here is timed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from clihelp import cli_command, make_repo, run_cli, write


def fact_entries(cache: Path) -> set[str]:
    return {p.name for p in (cache / "v2" / "facts").rglob("*") if p.is_file() and not p.name.startswith(".")}


def scan(root: Path, *args: str) -> dict:
    result = run_cli("scan", "--format", "json", *args, cwd=root)
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    doc["stats"].pop("seconds")
    return doc


def apis(doc: dict) -> list[tuple[str, int, str]]:
    return [(s["path"], s["line"], s["api"]) for s in doc["sites"]]


SMALL = {
    "eng/a.py": 'import torch\n\n\nclass A:\n    def __init__(self, n):\n        self.x = torch.empty(n, device="cuda")\n',
    "eng/b.py": 'import mylib\n\n\ndef grab(n):\n    return mylib.grab(n)\n',
    "eng/c.py": "def pure(n):\n    return n + 1\n",
}


def test_content_change_misses_only_for_that_file(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", SMALL)
    cache = tmp_path / "cache"
    first = scan(root, "--cache-dir", str(cache))
    entries = fact_entries(cache)
    assert len(entries) == 1  # eng/a.py; the files the pre-filter skips are kept in one table
    assert scan(root, "--cache-dir", str(cache)) == first  # warm
    assert fact_entries(cache) == entries
    write(root, "eng/a.py", SMALL["eng/a.py"] + '        self.y = torch.zeros(n, device="cuda")\n')
    changed = scan(root, "--cache-dir", str(cache))
    assert ("eng/a.py", 7, "torch.zeros") in apis(changed)
    assert len(fact_entries(cache) - entries) == 1, "only the edited file is analysed again"
    assert changed == scan(root, "--no-cache")


def test_a_file_known_to_be_skipped_is_not_read_again(tmp_path: Path) -> None:
    """The skipped files of the last run are answered from one table while
    their size, mtime and inode are unchanged (the same promise the digests
    of the warm path rely on): shown by changing a file's content behind
    the tool's back, keeping its stat."""
    plain = "def pure(n):\n    return n + 1\n"
    sneaky = 'import torch\nX = torch.empty(1, device="cuda")\n'
    width = max(len(plain), len(sneaky)) + 10
    root = make_repo(tmp_path / "p", {**SMALL, "eng/d.py": plain.ljust(width - 1, "#") + "\n"})
    cache = tmp_path / "cache"
    scan(root, "--cache-dir", str(cache))
    write(root, "eng/a.py", SMALL["eng/a.py"] + '        self.y = torch.zeros(n, device="cuda")\n')  # no whole-run result
    d = root / "eng/d.py"
    st = d.stat()
    d.write_text(sneaky.ljust(width - 1, "#") + "\n")
    os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert d.stat().st_size == st.st_size and d.stat().st_ino == st.st_ino
    trusted = scan(root, "--cache-dir", str(cache))
    assert ("eng/a.py", 7, "torch.zeros") in apis(trusted)
    assert not any(p == "eng/d.py" for p, _, _ in apis(trusted)), "d.py was read again"
    # a real edit (the mtime moves) is seen
    d.write_text(sneaky)
    changed = scan(root, "--cache-dir", str(cache))
    assert ("eng/d.py", 2, "torch.empty") in apis(changed)
    assert changed == scan(root, "--no-cache")


def test_catalogue_change_invalidates(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", SMALL)
    cache = tmp_path / "cache"
    before = scan(root, "--cache-dir", str(cache))
    assert not any(s["api"] == "mylib.grab" for s in before["sites"])
    write(root, "alloc-audit.toml", """
        [[apis]]
        names = ["mylib.grab"]
        kind = "device"
        device = "cuda"
        shape = "first"
        """)
    after = scan(root, "--cache-dir", str(cache))
    assert ("eng/b.py", 5, "mylib.grab") in apis(after)
    assert after == scan(root, "--no-cache")


def test_a_depth_knob_change_invalidates(tmp_path: Path) -> None:
    """`capture-depth` decides how far the capture rule follows calls: a
    change to it is a change of the result, not a warm hit."""
    root = make_repo(tmp_path / "p", {"eng/g.py": """import torch


def leaf(n):
    scratch = torch.empty(n, device="cuda")
    return scratch.sum()


def middle(n):
    return leaf(n)


def capture(g, n):
    with torch.cuda.graph(g):
        middle(n)
"""})
    cache = tmp_path / "cache"
    deep = scan(root, "--cache-dir", str(cache))
    assert any(f["rule"] == "alloc-in-capture" for f in deep["findings"])
    write(root, "alloc-audit.toml", "capture-depth = 0\n")
    shallow = scan(root, "--cache-dir", str(cache))
    assert shallow == scan(root, "--no-cache")
    assert not any(f["rule"] == "alloc-in-capture" for f in shallow["findings"])


def test_tool_version_change_invalidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: the salt of every key includes the version."""
    from alloc_audit.catalog import load_catalog
    from alloc_audit.config import find_project, load_config
    from alloc_audit.pipeline import run as pipeline

    root = make_repo(tmp_path / "p", SMALL)
    cache = tmp_path / "cache"
    config = load_config(*find_project(root))
    catalog = load_catalog(config)
    options = pipeline.ScanOptions(cache_dir=cache, jobs=1)
    first = pipeline.run_scan(config, catalog, options)
    entries = fact_entries(cache)
    pipeline.run_scan(config, catalog, options)
    assert fact_entries(cache) == entries
    monkeypatch.setattr(pipeline, "__version__", "999.0.0")
    again = pipeline.run_scan(config, catalog, options)
    assert len(fact_entries(cache)) == 2 * len(entries), "a new version must not read the old facts"
    assert [s.sort_key for s in again.sites] == [s.sort_key for s in first.sites]


def big_project(root: Path, files: int = 48) -> Path:
    """Enough source (> 1 MB, > 16 files) for the process pool to be used,
    with cross-file calls so the index and the rules have work."""
    sources = {}
    for i in range(files):
        body = [
            "import torch",
            f"from pkg.mod{(i + 1) % files} import helper{(i + 1) % files}",
            "",
            "",
            f"def helper{i}(x):",
            "    scratch = torch.empty(x.shape[0], device=\"cuda\")",
            "    return x.add_(scratch)",
            "",
            "",
            f"class Runner{i}:",
            "    def __init__(self, n):",
            '        self.keep = torch.empty(n, device="cuda")',
            "",
            "    def capture(self, graph, x):",
            "        with torch.cuda.graph(graph):",
            f"            return helper{(i + 1) % files}(x)",
            "",
        ]
        filler = [f"def filler_{i}_{k}(a, b):\n    return a * {k} + b\n" for k in range(20)]
        # the bulk is one string (a token to the parser: size without work;
        # as many comment lines, the grammar's time grows with the square of
        # the run)
        padding = 'PADDING = """\n' + f"padding to make module {i} large enough for the pool\n" * 560 + '"""\n'
        sources[f"pkg/mod{i}.py"] = "\n".join(body) + "\n" + "\n".join(filler) + "\n" + padding
    return make_repo(root, sources)


def test_jobs_and_cache_do_not_change_the_output(tmp_path: Path) -> None:
    root = big_project(tmp_path / "big")
    assert sum(p.stat().st_size for p in root.rglob("*.py")) > 1_000_000
    cache = tmp_path / "cache"
    one = scan(root, "--jobs", "1", "--no-cache")
    two_cold = scan(root, "--jobs", "2", "--cache-dir", str(cache))
    two_warm = scan(root, "--jobs", "2", "--cache-dir", str(cache))
    one_warm = scan(root, "--jobs", "1", "--cache-dir", str(cache))
    assert one == two_cold == two_warm == one_warm
    assert len(one["findings"]) == 48 and {f["rule"] for f in one["findings"]} == {"alloc-in-capture"}


@pytest.mark.slow  # run first (conftest.py)
def test_a_killed_run_leaves_a_usable_cache(tmp_path: Path) -> None:
    root = big_project(tmp_path / "big")
    cache = tmp_path / "cache"
    expected = scan(root, "--no-cache", "--jobs", "1")
    killed = 0
    for _ in range(2):
        stored = fact_entries(cache) if cache.exists() else set()
        proc = subprocess.Popen([*cli_command(), "scan", "--jobs", "2", "--cache-dir", str(cache)], cwd=root,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        # killed as soon as this run has stored facts of its own: the cache
        # then holds part of a run's work (and whatever it was writing)
        while proc.poll() is None and not (cache.exists() and fact_entries(cache) - stored):
            time.sleep(0.005)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            killed += 1
        proc.wait()
    assert killed, "every scan finished before it had stored a fact; make the project larger"
    assert scan(root, "--jobs", "2", "--cache-dir", str(cache)) == expected
    assert scan(root, "--jobs", "2", "--cache-dir", str(cache)) == expected


@pytest.mark.slow  # run first (conftest.py)
def test_two_concurrent_runs_agree(tmp_path: Path) -> None:
    root = big_project(tmp_path / "big")
    cache = tmp_path / "cache"
    expected = scan(root, "--no-cache", "--jobs", "1")
    env = {**os.environ, "NO_COLOR": "1"}
    procs = [subprocess.Popen([*cli_command(), "scan", "--format", "json", "--jobs", "2", "--cache-dir", str(cache)],
                              cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        doc = json.loads(out)
        doc["stats"].pop("seconds")
        outputs.append(doc)
    assert outputs[0] == outputs[1] == expected
    assert scan(root, "--cache-dir", str(cache)) == expected


def test_facts_do_not_depend_on_the_process(tmp_path: Path) -> None:
    """Extraction order must not follow hash seeds or node addresses (it once
    followed py-tree-sitter's unordered captures): the same file gives the
    same facts in every process."""
    root = big_project(tmp_path / "big", files=4)
    outputs = set()
    for seed in ("1", "2", "3"):
        proc = subprocess.run([*cli_command(), "scan", "--format", "json", "--no-cache", "--jobs", "1"], cwd=root,
                              capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
        doc = json.loads(proc.stdout)
        doc["stats"].pop("seconds")
        outputs.add(json.dumps(doc))
    assert len(outputs) == 1
    from alloc_audit.catalog import load_catalog
    from alloc_audit.config import find_project, load_config
    from alloc_audit.model import Language
    from alloc_audit.pipeline.extract import extract_facts
    from alloc_audit.pipeline.parse import parse_source

    apis = load_catalog(load_config(*find_project(root))).apis
    data = (root / "pkg" / "mod0.py").read_bytes()
    facts = {repr(extract_facts("pkg/mod0.py", Language.PYTHON,
                                parse_source(data, Language.PYTHON, apis.attribute_macros, apis.specifier_macros,
                                             apis.lone_macro_lines), apis))
             for _ in range(5)}
    assert len(facts) == 1


def test_a_fresh_checkout_with_a_restored_cache_reuses_the_skip_table(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """CI: the cache directory is restored into a fresh checkout (every mtime
    and inode new, maybe another path). Files the last run skipped and whose
    content is unchanged are answered from the skip table (hashed, not
    pre-filtered again in a worker); an edited one is read as before; the
    output is that of a run without a cache."""
    from alloc_audit.pipeline import workers

    files = {**SMALL, **{f"eng/plain{i}.py": f"def f{i}(n):\n    return n + {i}\n" for i in range(5)}}
    first = make_repo(tmp_path / "first", files)
    cache = tmp_path / "cache"
    scan(first, "--cache-dir", str(cache))
    checkout = make_repo(tmp_path / "ci" / "checkout", files)  # new path, mtimes and inodes
    write(checkout, "eng/plain0.py", 'import torch\nX = torch.empty(1, device="cuda")\n')  # changed in the PR
    to_workers: list[str] = []
    real = workers.run_files

    def recording(items, *args, **kwargs):  # type: ignore[no-untyped-def]
        to_workers.extend(f.path for f, _ in items)
        return real(items, *args, **kwargs)

    monkeypatch.setattr(workers, "run_files", recording)
    restored = scan(checkout, "--cache-dir", str(cache))
    assert ("eng/plain0.py", 2, "torch.empty") in apis(restored)
    assert not {f"eng/plain{i}.py" for i in range(1, 5)} & set(to_workers), "unchanged skipped files re-read"
    assert "eng/plain0.py" in to_workers
    monkeypatch.setattr(workers, "run_files", real)
    assert restored == scan(checkout, "--no-cache")
