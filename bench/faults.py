"""The fault table of issue 14: each bad input or fault, run against the
installed alloc-audit (or the one first on PYTHONPATH), as
``input -> exit code, traceback?, data lost?``.

    python bench/faults.py > after.md
    PYTHONPATH=/path/to/old/checkout python bench/faults.py > before.md

Each row builds a small project in a temporary directory and never touches
anything outside it (the device file is a /dev/null of its own, made with
mknod when permitted). tests/test_faults.py pins the same rows as tests.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

A_SITE = 'import torch\n\n\ndef f{i}(n):\n    return torch.empty(n, device="cuda")\n'
HOOK = '''
import os
import importlib
def _module(*names):
    for name in names:  # the layout before and after issue 10
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
if os.environ.get("ALLOC_AUDIT_FAULT") == "bug":
    _p = _module("alloc_audit.pipeline.run", "alloc_audit.pipeline")
    def _broken(*a, **k):
        raise RuntimeError("injected bug")
    _p.run_scan = _broken
if os.environ.get("ALLOC_AUDIT_FAULT") == "disk-full":
    _a = _module("alloc_audit.ratchet.allowlist", "alloc_audit.allowlist")
    def _full(*a, **k):
        raise OSError(28, "No space left on device")
    for _name in ("write_atomically", "atomic_write_bytes"):
        if hasattr(_a, _name):
            setattr(_a, _name, _full)
'''


class Row:
    def __init__(self, item: str, what: str) -> None:
        self.item, self.what = item, what
        self.code: str = ""
        self.traceback = False
        self.lost = ""

    def markdown(self) -> str:
        return f"| {self.item} | {self.what} | {self.code} | {'yes' if self.traceback else 'no'} | {self.lost} |"


def cli(root: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int | None, str, str]:
    exe = [sys.executable, "-c", "import sitecustomize_faults; from alloc_audit.__main__ import entry; entry()"]
    full = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": os.pathsep.join(
        [str(HOOK_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]), **(env or {})}
    try:
        proc = subprocess.run([*exe, *args], cwd=root, capture_output=True, text=True, errors="replace", env=full,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", ""
    return proc.returncode, proc.stdout, proc.stderr


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


def project(base: Path, files: int = 4, config: str = "", use_git: bool = True) -> Path:
    root = Path(tempfile.mkdtemp(dir=base))
    (root / "alloc-audit.toml").write_text(config or "# faults\n")
    (root / "src").mkdir()
    for i in range(files):
        (root / "src" / f"m{i:02}.py").write_text(A_SITE.format(i=i))
    if use_git:
        git(root, "init", "-q")
        git(root, "add", "-A")
        git(root, "commit", "-qm", "x")
    code, _out, err = cli(root, "allowlist", "init", "--no-cache")
    assert code == 0, err
    return root


def entries(root: Path) -> set[str]:
    out = set()
    for path in (root / "allowlists").glob("*.allowlist"):
        out |= {line.split(" #")[0] for line in path.read_text().splitlines() if line and not line.startswith("#")}
    return out


def outcome(row: Row, result: tuple[int | None, str, str]) -> tuple[int | None, str, str]:
    code, out, err = result
    row.code = "hang (killed at the timeout)" if code is None else str(code)
    row.traceback = "Traceback" in err
    return result


def lost_entries(row: Row, before: set[str], root: Path) -> None:
    gone = before - entries(root)
    row.lost = f"{len(gone)} of {len(before)} entries deleted" if gone else "no"


# ---------------------------------------------------------------- rows


def update_after(base: Path, item: str, what: str, damage: Callable[[Path], None], config: str = "") -> Row:
    row = Row(item, what)
    root = project(base, config=config)
    before = entries(root)
    damage(root)
    outcome(row, cli(root, "allowlist", "update", "--no-cache"))
    lost_entries(row, before, root)
    return row


def deep(lines: int) -> str:
    return "".join("    " * i + "if x:\n" for i in range(lines)) + "    " * lines + 's = "s"\n'


def rows_data_loss(base: Path) -> list[Row]:
    rows = [
        update_after(base, "1", "`allowlist update`, a file over max-file-size",
                     lambda r: (r / "src/m00.py").write_text(A_SITE.format(i=0) + "x = 1\n" * 400),
                     "max-file-size = 2000\n"),
        update_after(base, "1", "`allowlist update`, a file with a NUL byte",
                     lambda r: (r / "src/m00.py").write_bytes(A_SITE.format(i=0).encode() + b"\0")),
        update_after(base, "1", "`allowlist update`, a call through a 250-character name",
                     lambda r: (r / "src/m00.py").write_text(A_SITE.format(i=0) + f"\nx = {'a' * 250}.{'a' * 250}()\n")),
    ]
    for use_git in (True, False):
        row = Row("1", f"`scan`, a file whose name is not UTF-8 ({'git' if use_git else 'no git'})")
        root = project(base, files=1, use_git=use_git)
        (root / "src").joinpath(os.fsdecode(b"c\xff.py")).write_text(A_SITE.format(i=9))
        code, out, err = outcome(row, cli(root, "scan", "--format", "json", "--no-cache"))
        try:
            json.loads(out)
            row.lost = ("output is not valid UTF-8 (the name's raw byte)" if "\ufffd" in out and "analysed" not in out
                        else "no (listed under errors)")
        except ValueError:
            row.lost = "no output"
        rows.append(row)

    row = Row("2", "`allowlist update` while the cache directory is deleted (4 runs)")
    lost_runs = 0
    worst = ""
    for _attempt in range(4):
        root = project(base, files=60)
        shutil.rmtree(root / ".alloc-audit-cache", ignore_errors=True)
        before = entries(root)
        stop = threading.Event()

        def vanish(cache: Path = root / ".alloc-audit-cache", stop: threading.Event = stop) -> None:
            while not stop.is_set():
                shutil.rmtree(cache, ignore_errors=True)
                time.sleep(0.002)

        thread = threading.Thread(target=vanish)
        thread.start()
        result = cli(root, "allowlist", "update", "--jobs", "1")
        stop.set()
        thread.join()
        outcome(row, result)
        gone = before - entries(root)
        if gone:
            lost_runs += 1
            worst = f"{len(gone)} of {len(before)}"
    row.lost = f"entries deleted in {lost_runs} of 4 runs (worst {worst})" if lost_runs else "no (0 of 4 runs)"
    rows.append(row)

    row = Row("3", "`scan`, a cache entry edited (same length, still decodes)")
    root = project(base)
    cold = cli(root, "scan", "--format", "json", "--no-cache")[1]
    cli(root, "scan", "--format", "json")
    for path in (root / ".alloc-audit-cache").rglob("*"):
        if path.is_file() and b"torch.empty" in path.read_bytes():
            path.write_bytes(path.read_bytes().replace(b"torch.empty", b"torch.ZZZZZ"))
    code, warm, err = outcome(row, cli(root, "scan", "--format", "json"))

    def strip(text: str) -> str:
        return "\n".join(line for line in text.splitlines() if '"seconds"' not in line)

    row.lost = "no (same as --no-cache)" if strip(warm) == strip(cold) else "wrong output (APIs as edited)"
    rows.append(row)

    row = Row("4", "two concurrent `allowlist update` (--add-new and plain), 6 rounds")
    root = project(base, files=10)
    for i in range(10):
        (root / "src" / f"n{i:02}.py").write_text(A_SITE.format(i=100 + i))
    text = (root / "allowlists" / "alloc-audit.allowlist").read_text()
    lost = 0
    for _round in range(6):
        (root / "allowlists" / "alloc-audit.allowlist").write_text(text)
        env = {**os.environ, "NO_COLOR": "1"}
        procs = [subprocess.Popen([sys.executable, "-m", "alloc_audit", "allowlist", "update", *extra, "--no-cache"],
                                  cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for extra in (["--add-new"], [])]
        codes = [p.wait() for p in procs]
        row.code = ", ".join(str(c) for c in codes)
        if len(entries(root)) < 20:
            lost += 1
    row.lost = f"the other run's additions lost in {lost} of 6" if lost else "no (0 of 6)"
    rows.append(row)

    row = Row("5", "`allowlist init --force`, the write fails (disk full)")
    root = project(base)
    path = root / "allowlists" / "alloc-audit.allowlist"
    path.write_text(path.read_text().replace("T4", "T4 # reason", 1))
    old = path.read_text()
    outcome(row, cli(root, "allowlist", "init", "--force", "--no-cache", env={"ALLOC_AUDIT_FAULT": "disk-full"}))
    row.lost = "no" if path.exists() and path.read_text() == old else "the old allowlist deleted"
    rows.append(row)

    rows += special_outputs(base)
    return rows


def special_outputs(base: Path) -> list[Row]:
    rows = []
    root = project(base)
    tmp = Path(tempfile.mkdtemp(dir=base))
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    target = tmp / "target.json"
    target.write_text("{}")
    link = tmp / "link.json"
    link.symlink_to(target)
    cases: list[tuple[str, Path, Callable[[int], bool]]] = [("a FIFO", fifo, stat.S_ISFIFO),
                                                             ("a symlink", link, stat.S_ISLNK)]
    try:
        device = tmp / "null"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        cases.append(("a character device (our own /dev/null)", device, stat.S_ISCHR))
    except PermissionError:
        pass
    for name, path, still in cases:
        row = Row("6", f"`scan -o` {name}")
        reader = None
        if name == "a FIFO":
            def drain() -> None:
                with open(fifo, "rb") as fh:
                    fh.read()
            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
        outcome(row, cli(root, "scan", "--format", "json", "--no-cache", "-o", str(path), timeout=60))
        if reader is not None:
            if reader.is_alive():  # the FIFO was replaced: unblock the reader
                try:
                    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                    os.close(fd)
                except OSError:
                    pass
        row.lost = "no" if os.path.lexists(path) and still(os.lstat(path).st_mode) else "replaced by a regular file"
        rows.append(row)
    if len(cases) == 3:
        device = cases[2][1]
        text = next((root / "allowlists").glob("*.allowlist")).read_text()
        (tmp / "base").write_text(text)
        row = Row("6", "`allowlist merge-driver` with %A a character device")
        outcome(row, cli(root, "allowlist", "merge-driver", str(tmp / "base"), str(device), str(tmp / "base")))
        row.lost = "no" if stat.S_ISCHR(os.lstat(device).st_mode) else "replaced by a regular file"
        rows.append(row)
    return rows


def rows_crashes(base: Path) -> list[Row]:
    rows = []
    for jobs in ("1", "2"):
        row = Row("7", f"`scan --jobs {jobs}`, Python nested 520 levels (+ 20 files of 120 KB)")
        root = project(base, files=20)
        for i in range(20):
            with open(root / "src" / f"m{i:02}.py", "a") as fh:
                fh.write("x = 1\n" * 20_000)
        (root / "src" / "deep.py").write_text(A_SITE.format(i=99) + deep(520))
        code, out, _err = outcome(row, cli(root, "scan", "--format", "json", "--no-cache", "--jobs", jobs))
        if code is not None and code < 0:
            row.code = f"{code} (killed by signal {-code})"
        try:
            doc = json.loads(out)
            row.lost = f"no ({len(doc['sites'])} sites, deep.py under errors)"
        except ValueError:
            row.lost = "the whole report (no output)"
        rows.append(row)

    def bad(item: str, what: str, setup: Callable[[Path], list[str]], timeout: float = 120) -> None:
        row = Row(item, what)
        root = project(base)
        args = setup(root)
        outcome(row, cli(root, *args, timeout=timeout))
        row.lost = "no"
        rows.append(row)

    def loop(root: Path) -> list[str]:
        (root / "l1.py").symlink_to("l2.py")
        (root / "l2.py").symlink_to("l1.py")
        return ["scan", "l1.py"]

    def cache_file(root: Path) -> list[str]:
        (root / "afile").write_text("x")
        return ["scan", "--cache-dir", "afile"]

    def api5(root: Path) -> list[str]:
        (root / "cat.toml").write_text("api = 5\n")
        (root / "alloc-audit.toml").write_text('api-catalogues = ["cat.toml"]\n')
        return ["scan", "--no-cache"]

    def depth(root: Path) -> list[str]:
        (root / "alloc-audit.toml").write_text("capture-depth = 100000000\n")
        for i in range(8):  # a call chain for the capture rule to follow
            (root / "src" / f"c{i}.py").write_text(textwrap.dedent(f"""
                import torch
                from src.c{i + 1} import g{i + 1}
                def g{i}(n):
                    with torch.cuda.graph(n):
                        g{i + 1}(n)
                    return torch.empty(n, device="cuda")
                """))
        return ["scan", "--no-cache"]

    bad("8", "`scan` a symlink loop given as a path", loop)
    bad("8", "`scan --cache-dir` naming a file", cache_file)
    bad("8", "`scan`, an API catalogue with `api = 5`", api5)
    bad("8", "`scan`, `capture-depth = 100000000` (60 s limit)", depth, timeout=60)
    for suffix, n in ((".cu", 5000), (".py", 20000)):
        row = Row("9", f"`scan`, a {n:,}-branch {'else if' if suffix == '.cu' else 'elif'} chain ({suffix}), CPU s")
        root = project(base, files=1)
        if suffix == ".cu":
            text = "void f(int x){ float* p;\n if (x==0) { cudaMalloc(&p, 4); }\n" + "".join(
                f" else if (x=={i}) {{ cudaMalloc(&p, {i}); }}\n" for i in range(1, n)) + "}\n"
        else:
            text = 'import torch\ndef f(x):\n    if x == 0:\n        y = torch.empty(1, device="cuda")\n' + "".join(
                f'    elif x == {i}:\n        y = torch.empty({i}, device="cuda")\n' for i in range(1, n))
        (root / "src" / f"chain{suffix}").write_text(text)
        import resource

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        outcome(row, cli(root, "scan", "--format", "json", "--no-cache", "--jobs", "1", "-o", "out.json",
                         timeout=600))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        row.lost = f"no; {after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime:.1f} s CPU"
        rows.append(row)
    row = Row("9", "`max-file-size = 100000000` (a 50 MB file allowed)")
    root = project(base)
    (root / "alloc-audit.toml").write_text("max-file-size = 100000000\n")
    outcome(row, cli(root, "scan", "--no-cache"))
    row.lost = "no"
    rows.append(row)

    row = Row("10", "`check`, an internal error (a bug injected in the scan)")
    root = project(base)
    outcome(row, cli(root, "check", "--no-cache", env={"ALLOC_AUDIT_FAULT": "bug"}))
    row.lost = "no"
    rows.append(row)

    row = Row("11", "`check`, `allowlist update`: a file over max-file-size is shown")
    root = project(base, config="max-file-size = 2000\n")
    (root / "src" / "m00.py").write_text(A_SITE.format(i=0) + "x = 1\n" * 400)
    shown = []
    for args in (("check", "--no-cache"), ("allowlist", "update", "--no-cache", "--dry-run")):
        code, out, err = cli(root, *args)
        shown.append("src/m00.py" in out + err and ("not analysed" in out + err or "larger" in out + err))
    row.code = "-"
    row.lost = "no (listed)" if all(shown) else "the file looks like a file with no sites"
    rows.append(row)
    return rows


HOOK_DIR = Path(tempfile.mkdtemp(prefix="alloc-audit-faults-hook-"))


def main() -> int:
    (HOOK_DIR / "sitecustomize_faults.py").write_text(HOOK)
    random.seed(0)
    with tempfile.TemporaryDirectory(prefix="alloc-audit-faults-") as tmp:
        rows = rows_data_loss(Path(tmp)) + rows_crashes(Path(tmp))
    print("| item | input | exit code | traceback? | data lost? |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(row.markdown())
    shutil.rmtree(HOOK_DIR, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
