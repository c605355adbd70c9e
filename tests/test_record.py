"""The recording helper's argument handling (no torch here), and the promise
that ``join`` never imports torch: with ``torch`` made unimportable, join
still reads the recorded snapshots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from alloc_audit.record import parse_args, snapshot_name

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("argv", "program", "out", "stacks"), [
    pytest.param(["--", "python", "serve.py", "--steps", "3"], ["serve.py", "--steps", "3"], ".", "python",
                 id="record -- python script.py"),
    pytest.param(["--out", "snaps", "--stacks", "all", "--", "-m", "pkg.serve"], ["-m", "pkg.serve"], "snaps", "all",
                 id="options, then a module"),
    pytest.param(["--", "python3.12", "x.py"], ["x.py"], ".", "python", id="a versioned interpreter name"),
    pytest.param(["x.py", "--flag"], ["x.py", "--flag"], ".", "python", id="no separator: all program"),
])
def test_parse_args(argv: list[str], program: list[str], out: str, stacks: str) -> None:
    args, prog = parse_args(argv)
    assert prog == program and args.out == Path(out) and args.stacks == stacks


def test_parse_args_wants_a_program() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--", "python"])


def test_snapshot_names_carry_the_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    assert snapshot_name(Path("o")) == Path("o/snapshot-rank3.pickle.gz")


def test_join_never_imports_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; "  # `import torch` now raises ImportError
            "sys.argv = ['alloc-audit', 'join', 'tests/data/runtime/minigen-all.pickle.gz', "
            "'tests/data/runtime/minigen-native.jsonl', 'examples', '-f', 'json']; "
            "from alloc_audit.__main__ import entry; entry()")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert '"schema": "alloc-audit-join/1"' in proc.stdout


def test_record_without_torch_says_what_to_install() -> None:
    code = ("import sys; sys.modules['torch'] = None; "
            "from alloc_audit.record import main; sys.exit(main(['--', 'python', 'x.py']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "recording needs torch (pip install 'alloc-audit[record]')" in proc.stderr
