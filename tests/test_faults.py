"""The fault table of issue 14, one test per row: bad input and faults must
never lose an allowlist entry, crash the process, or hide a file problem.

A file that could not be analysed (too large, binary, an undecodable name,
a parser or extractor failure) has unknown sites, not zero: its entries are
"not checked", kept by `allowlist update` and failed on by `check`/`gate`
unless `--unchecked warn`. bench/results/faults.md has the table before and
after."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from pathlib import Path

import pytest
from clihelp import git, make_repo, run_cli, scan_json, write

from alloc_audit.__main__ import entry
from alloc_audit.ratchet.allowlist import load_allowlist

A_SITE = 'import torch\n\n\ndef f(n):\n    return torch.empty(n, device="cuda")\n'
B_SITE = 'import torch\n\n\ndef g(n):\n    return torch.zeros(n, device="cuda")\n'


def project(tmp_path: Path, config: str = "") -> Path:
    root = make_repo(tmp_path / "p", {"src/a.py": A_SITE, "src/b.py": B_SITE}, config=config)
    assert run_cli("allowlist", "init", cwd=root).code == 0
    return root


def entry_keys(root: Path) -> set[tuple[str, str, str]]:
    return {e.key for e in load_allowlist(root / "allowlists", root) or ()}


def in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], root: Path,
               *args: str) -> tuple[int, str, str]:
    """The real console entry point, in this process (for injected faults)."""
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["alloc-audit", *args])
    monkeypatch.setenv("NO_COLOR", "1")
    code = 0
    try:
        entry()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------- 1, 11: unanalysed is not empty

DEEP_PY = "".join("    " * i + "if x:\n" for i in range(520)) + "    " * 520 + 's = "s"\n'
LONG_NAME = "a" * 250


@pytest.mark.parametrize("damage", [
    pytest.param(lambda p: p.write_text(A_SITE + "x = 1\n" * 400), id="over the size limit"),
    pytest.param(lambda p: p.write_bytes(A_SITE.encode() + b"\0"), id="binary (a NUL byte)"),
    pytest.param(lambda p: p.write_text(A_SITE + DEEP_PY), id="nested 520 levels (parser crash)"),
])
def test_update_keeps_and_check_fails_on_entries_of_files_not_analysed(tmp_path: Path, damage: object) -> None:
    root = project(tmp_path, config="max-file-size = 2000\n")
    before = (root / "allowlists" / "alloc-audit.allowlist").read_text()
    damage(root / "src" / "a.py")  # type: ignore[operator]

    check = run_cli("check", "--no-cache", cwd=root)
    assert check.code == 1, check.out + check.err
    assert "Traceback" not in check.err
    assert "allowlist entry not checked: src/a.py f torch.empty" in check.out
    assert "src/a.py:1: warning: file not analysed" in check.out
    assert "stale" not in check.out.replace("0 stale", "")

    update = run_cli("allowlist", "update", "--no-cache", cwd=root)
    assert update.code == 0, update.err
    assert "? not checked src/a.py f torch.empty kept as it is" in update.out
    assert (root / "allowlists" / "alloc-audit.allowlist").read_text() == before

    accepted = run_cli("check", "--no-cache", "--unchecked", "warn", cwd=root)
    assert accepted.code == 0, accepted.out


def test_a_call_through_a_very_long_name_keeps_the_files_sites(tmp_path: Path) -> None:
    root = project(tmp_path)
    write(root, "src/a.py", A_SITE + f"\n\ndef h(n):\n    {LONG_NAME}.{LONG_NAME}(n)\n")
    update = run_cli("allowlist", "update", "--no-cache", cwd=root)
    assert update.code == 0 and "removed" not in update.out, update.out
    assert ("src/a.py", "f", "torch.empty") in entry_keys(root)
    doc = json.loads(run_cli("scan", "--format", "json", "--no-cache", cwd=root).out)
    assert doc["errors"] == []


def test_undecodable_file_name_is_reported_not_dropped(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "src").joinpath(os.fsdecode(b"c\xff.py")).write_text(B_SITE.replace("def g", "def k"))
    result = run_cli("scan", "--format", "json", "--no-cache", cwd=root)
    assert result.code == 0 and "Traceback" not in result.err, result.err
    doc = json.loads(result.out)
    assert doc["errors"] == [{"path": "src/c\ufffd.py", "analysed": False,
                              "message": "file name is not valid UTF-8; not scanned (rename the file)"}]
    check = run_cli("check", "--no-cache", cwd=root)
    assert "src/c\ufffd.py:1: warning: file not analysed" in check.out


def test_init_update_and_gate_show_file_problems(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"src/a.py": A_SITE, "src/big.py": B_SITE + "x = 1\n" * 400},
                     config="max-file-size = 2000\n")
    init = run_cli("allowlist", "init", "--no-cache", cwd=root)
    assert "! not analysed  src/big.py: larger than the 2,000 bytes limit" in init.err
    assert "1 file not analysed" in init.out
    git(root, "add", "-A")
    git(root, "commit", "-qm", "allowlist")
    update = run_cli("allowlist", "update", "--no-cache", cwd=root)
    assert "1 file not analysed" in update.out
    gate = run_cli("gate", "--base", "HEAD", "--no-cache", cwd=root)
    assert "src/big.py:1: warning: file not analysed" in gate.out
    assert "1 file not analysed" in gate.out


# ---------------------------------------------------------------- 2, 3: the cache


def scan_doc(root: Path, *args: str) -> dict:
    return scan_json(root, "--jobs", "1", *args)


def test_cache_deleted_during_the_run_loses_no_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from alloc_audit.pipeline.cache import Cache

    root = project(tmp_path)
    shutil.rmtree(root / ".alloc-audit-cache")  # a cold run: every file is stored
    original = Cache.store
    calls = [0]

    def store_then_vanish(self: Cache, key: str, value: object) -> None:
        original(self, key, value)
        calls[0] += 1
        if calls[0] == 1 and self.directory is not None:
            shutil.rmtree(self.directory)  # another process cleans the cache

    monkeypatch.setattr(Cache, "store", store_then_vanish)
    code, out, err = in_process(monkeypatch, capsys, root, "allowlist", "update", "--jobs", "1")
    assert code == 0, err
    assert "removed" not in out
    assert entry_keys(root) == {("src/a.py", "f", "torch.empty"), ("src/b.py", "g", "torch.zeros")}
    assert calls[0] >= 2
    # and a scan whose cache vanishes gives what --no-cache gives
    shutil.rmtree(root / ".alloc-audit-cache")
    calls[0] = 0
    code, out, err = in_process(monkeypatch, capsys, root, "scan", "--format", "json", "--jobs", "1")
    assert code == 0, err
    doc = json.loads(out)
    doc["stats"].pop("seconds")
    assert doc == scan_doc(root, "--no-cache")


def test_edited_cache_entry_is_a_miss(tmp_path: Path) -> None:
    root = project(tmp_path)
    cold = scan_doc(root, "--no-cache")
    scan_doc(root)  # fills the cache
    edited = 0
    for path in (root / ".alloc-audit-cache").rglob("*"):
        if path.is_file() and b"torch.empty" in path.read_bytes():
            # same length: the entry still decodes, but says something else
            path.write_bytes(path.read_bytes().replace(b"torch.empty", b"torch.ZZZZZ"))
            edited += 1
    assert edited
    assert scan_doc(root) == cold


# ---------------------------------------------------------------- 4, 5, 6: writes


def test_concurrent_update_keeps_the_other_runs_additions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path)
    write(root, "src/c.py", B_SITE.replace("def g", "def h"))
    allowlist = root / "allowlists" / "alloc-audit.allowlist"
    from alloc_audit.commands import allowlist as command

    original = command.scan_project

    def scan_while_another_run_writes(*args: object, **kwargs: object) -> object:
        result = original(*args, **kwargs)  # type: ignore[arg-type]
        # the other run (`update --add-new`) finishes while this one scans
        allowlist.write_text(allowlist.read_text() + "src/c.py h torch.zeros T4 # accepted by the other run\n")
        return result

    monkeypatch.setattr(command, "scan_project", scan_while_another_run_writes)
    code, out, err = in_process(monkeypatch, capsys, root, "allowlist", "update", "--no-cache")
    assert code == 0, err
    assert "src/c.py h torch.zeros T4 # accepted by the other run" in allowlist.read_text()


def test_init_force_keeps_the_old_allowlist_when_the_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from alloc_audit.ratchet import allowlist as ratchet

    root = project(tmp_path)
    allowlist = root / "allowlists" / "alloc-audit.allowlist"
    allowlist.write_text(allowlist.read_text().replace("torch.empty T4", "torch.empty T4 # a reason init drops"))
    old = allowlist.read_text()

    def disk_full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ratchet, "atomic_write_bytes", disk_full)
    code, _out, err = in_process(monkeypatch, capsys, root, "allowlist", "init", "--force", "--no-cache")
    assert code == 2, err
    assert "No space left on device" in err
    assert (root / "allowlists" / "alloc-audit.allowlist").read_text() == old


def test_init_force_split_replaces_the_old_files_after_writing(tmp_path: Path) -> None:
    root = project(tmp_path)
    result = run_cli("allowlist", "init", "--force", "--split-by-directory", "--no-cache", cwd=root)
    assert result.code == 0, result.err
    assert sorted(p.name for p in (root / "allowlists").iterdir() if p.suffix == ".allowlist") == ["src.allowlist"]


def _special_outputs(tmp_path: Path) -> list[tuple[str, Path, object]]:
    fifo = tmp_path / "fifo.out"
    os.mkfifo(fifo)
    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    out = [("fifo", fifo, stat.S_ISFIFO), ("symlink", link, stat.S_ISLNK)]
    try:
        device = tmp_path / "null"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
        out.append(("device", device, stat.S_ISCHR))
    except PermissionError:
        pass
    return out


def _drain(path: Path) -> threading.Thread:
    def read() -> None:
        with open(path, "rb") as fh:
            fh.read()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_output_to_special_files_writes_through_and_never_replaces(tmp_path: Path) -> None:
    root = project(tmp_path)
    for name, path, still in _special_outputs(tmp_path):
        reader = _drain(path) if name == "fifo" else None
        result = run_cli("scan", "--format", "json", "--no-cache", "-o", str(path), cwd=root)
        assert result.code == 0, (name, result.err)
        if reader:
            reader.join(10)
        assert still(os.lstat(path).st_mode), name  # type: ignore[operator]
    assert json.loads((tmp_path / "target.json").read_text())["schema"] == "alloc-audit/1"


def test_merge_driver_never_replaces_special_files(tmp_path: Path) -> None:
    root = project(tmp_path)
    text = (root / "allowlists" / "alloc-audit.allowlist").read_text()
    base = tmp_path / "base"
    base.write_text(text)
    theirs = tmp_path / "theirs"
    theirs.write_text(text)
    for name, path, still in _special_outputs(tmp_path):
        if name == "fifo":
            continue  # git hands the driver regular files or links
        if name == "symlink":
            (tmp_path / "target.json").write_text(text)
        result = run_cli("allowlist", "merge-driver", str(base), str(path), str(theirs), cwd=root)
        assert result.code == 0, (name, result.err)
        assert still(os.lstat(path).st_mode), name  # type: ignore[operator]


# ---------------------------------------------------------------- 7: crash isolation


def test_deep_nesting_is_a_file_error_with_any_jobs(tmp_path: Path) -> None:
    # 20 files of 120 kB: enough for the process pool (16 files, 1 MB); the
    # bulk is one string literal, cheap to parse, so the test costs the pool
    # and not 400,000 statements parsed twice
    pad = 'PAD = """\n' + "x = 1\n" * 20_000 + '"""\n'
    files = {f"src/m{i:02}.py": A_SITE.replace("def f", f"def f{i}") + pad for i in range(20)}
    files["src/deep.py"] = A_SITE + DEEP_PY
    root = make_repo(tmp_path / "p", files)
    one = scan_doc(root, "--no-cache", "--jobs", "1")
    two = scan_doc(root, "--no-cache", "--jobs", "2")
    assert one == two
    assert [e["path"] for e in one["errors"] if not e["analysed"]] == ["src/deep.py"]
    assert len(one["sites"]) == 20


def test_the_pool_survives_a_worker_that_dies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import faulthandler
    import signal

    from alloc_audit.model import Language
    from alloc_audit.pipeline import workers
    from alloc_audit.pipeline.cache import Cache
    from alloc_audit.pipeline.discover import SourceFile

    real = workers.process_file

    def crash_on_bad(source: SourceFile, *args: object) -> object:
        if source.path == "bad.py":
            faulthandler.disable()  # pytest's handler, inherited by the worker, would print a traceback to the suite's output
            os.kill(os.getpid(), signal.SIGSEGV)  # what a native parser crash looks like
        return real(source, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(workers, "process_file", crash_on_bad)
    items = []
    for i in range(40):
        path = tmp_path / f"f{i:02}.py"
        path.write_text(A_SITE)
        # sizes stated large, so the run takes the process pool
        items.append((SourceFile(path.name, str(path), Language.PYTHON, 100_000, 0, i), False))
    (tmp_path / "bad.py").write_text(A_SITE)
    items.append((SourceFile("bad.py", str(tmp_path / "bad.py"), Language.PYTHON, 100_000, 0, 99), False))
    from alloc_audit.catalog import load_catalog
    from alloc_audit.config import Config

    catalog = load_catalog(Config(root=tmp_path))
    outcomes = {o.path: o for o in workers.run_files(items, catalog, Cache(None, "salt"), 2)}
    assert sorted(outcomes) == sorted(s.path for s, _force in items)
    assert outcomes["bad.py"].status is workers.Status.FAILED
    assert "crashed" in (outcomes["bad.py"].message or "")
    assert all(o.status is workers.Status.FACTS for p, o in outcomes.items() if p != "bad.py")


# ---------------------------------------------------------------- 8: bad input is a usage error


@pytest.mark.parametrize("config, args, message", [
    pytest.param("", ("scan", "loop.py"), "loop.py: cannot read: Too many levels of symbolic links", id="symlink loop"),
    pytest.param("", ("scan", "--cache-dir", "afile"), "the cache directory is not a directory", id="cache-dir a file"),
    pytest.param('api-catalogues = ["cat.toml"]\n', ("scan",), "'api' must be an array of tables",
                 id="api = 5 in a catalogue"),
    pytest.param("capture-depth = 100000000\n", ("scan",), "'capture-depth' must be an integer from 0 to 32",
                 id="capture-depth 1e8"),
    pytest.param("capture-info-bytes = 2000000000000\n", ("scan",),
                 "'capture-info-bytes' must be an integer from 0 to 1099511627776", id="capture-info-bytes 2 TB"),
    pytest.param("max-file-size = 100000000\n", ("scan",), "'max-file-size' must be an integer from 1 to 33554432",
                 id="max-file-size 100 MB"),
])
def test_bad_input_exits_2_without_traceback(tmp_path: Path, config: str, args: tuple[str, ...],
                                             message: str) -> None:
    root = make_repo(tmp_path / "p", {"src/a.py": A_SITE, "cat.toml": "api = 5\n", "afile": "x\n"}, config=config)
    (root / "loop.py").symlink_to("loop2.py")
    (root / "loop2.py").symlink_to("loop.py")
    result = run_cli(*args, "--no-cache" if args[-1] != "afile" else "--jobs=1", cwd=root)
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    assert message in result.err


# ---------------------------------------------------------------- 10: internal errors


def test_internal_error_exits_3_and_says_where_to_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from alloc_audit.pipeline import run as pipeline

    root = project(tmp_path)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(pipeline, "run_scan", broken)
    code, _out, err = in_process(monkeypatch, capsys, root, "check", "--no-cache")
    assert code == 3
    assert "internal error (RuntimeError: a bug)" in err
    assert "report it to" in err and "--debug" in err
    assert "Traceback" not in err
    code, _out, err = in_process(monkeypatch, capsys, root, "check", "--no-cache", "--debug")
    assert code == 3 and "Traceback" in err
    assert "3 internal error" in run_cli("--help", cwd=root).out


# ---------------------------------------------------------------- real processes: kills and races


def many_sites_project(tmp_path: Path, files: int = 30) -> Path:
    sources = {f"src/m{i:02}.py": A_SITE.replace("def f", f"def f{i}") for i in range(files)}
    root = make_repo(tmp_path / "p", sources)
    assert run_cli("allowlist", "init", "--no-cache", cwd=root).code == 0
    return root


def test_sigkill_during_update_never_leaves_a_torn_allowlist(tmp_path: Path) -> None:
    import signal
    import subprocess
    import time

    from clihelp import cli_command

    from alloc_audit.ratchet.allowlist import parse_allowlist

    root = many_sites_project(tmp_path)
    allowlist = root / "allowlists" / "alloc-audit.allowlist"
    for i in range(30):  # new sites, so every update has something to write
        write(root, f"src/n{i:02}.py", B_SITE.replace("def g", f"def g{i}"))
    old = allowlist.read_text()
    for delay in (0.2, 0.4, 0.6, 0.8, 1.0, 1.3):
        proc = subprocess.Popen([*cli_command(), "allowlist", "update", "--add-new", "--no-cache", "--jobs", "1"],
                                cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        text = allowlist.read_text()
        entries = parse_allowlist(text, "allowlist")  # never torn: it parses
        assert text == old or len(entries) == 60, delay
        allowlist.write_text(old)


@pytest.mark.slow  # run first (conftest.py)
def test_concurrent_updates_in_two_processes_lose_nothing(tmp_path: Path) -> None:
    import subprocess

    from clihelp import cli_command

    root = many_sites_project(tmp_path, files=10)
    for i in range(10):
        write(root, f"src/n{i:02}.py", B_SITE.replace("def g", f"def g{i}"))
    allowlist = root / "allowlists" / "alloc-audit.allowlist"
    old = allowlist.read_text()
    for _round in range(3):
        allowlist.write_text(old)
        adder = subprocess.Popen([*cli_command(), "allowlist", "update", "--add-new", "--no-cache"], cwd=root,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        pruner = subprocess.Popen([*cli_command(), "allowlist", "update", "--no-cache"], cwd=root,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert adder.wait() == 0 and pruner.wait() == 0
        assert len(entry_keys(root)) == 20  # the additions of --add-new survive the other run
