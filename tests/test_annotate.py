"""Writing decisions into sources: exact round trips and no-op identity."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest
from clihelp import cli_command, make_repo, run_cli, write

from alloc_audit.commands.annotate import Edit, annotate_native, annotate_python

PY = b'''# -*- coding: latin-1 -*-
"""caf\xe9"""
import torch


def f(n):
    x = 1  # keep me
    # a comment above
    buf = torch.empty(
        n, device="cuda")  # trailing
    if n:
        y = torch.zeros(n)
    return buf
'''


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(PY, id="latin-1 with comments"),
        pytest.param(PY.replace(b"\n", b"\r\n"), id="crlf"),
        pytest.param(b"", id="empty"),
        pytest.param(b"x = (1,\n     2)\n\n\n\n# trailing comment", id="no final newline"),
    ],
)
def test_no_edits_is_byte_identical(source: bytes) -> None:
    assert annotate_python(source, []) == source
    assert annotate_native(source, []) == source


def test_python_comment_goes_above_the_statement_at_its_indentation() -> None:
    out = annotate_python(PY, [Edit(9, "alloc-audit: tier=T2 kept across steps", "tier")])
    assert out == PY.replace(b"    buf = torch.empty(", b"    # alloc-audit: tier=T2 kept across steps\n    buf = torch.empty(")


def test_python_replaces_an_annotation_of_the_same_kind() -> None:
    once = annotate_python(PY, [Edit(9, "alloc-audit: tier=T2 first", "tier")])
    twice = annotate_python(once, [Edit(10, "alloc-audit: tier=T3 second", "tier")])
    assert b"first" not in twice and twice.count(b"alloc-audit:") == 1 and b"tier=T3 second" in twice


def test_python_compound_statement() -> None:
    out = annotate_python(PY, [Edit(11, "alloc-audit: ignore[grow-on-demand] warm-up only", "ignore",
                                    ("grow-on-demand",))])
    assert b"    # alloc-audit: ignore[grow-on-demand] warm-up only\n    if n:" in out


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_native_line_at_the_statement_indentation(newline: bytes) -> None:
    source = newline.join([b"void f() {", b"  int x;", b"    CHECK(cudaMalloc(&p,", b"                     n));", b"}", b""])
    out = annotate_native(source, [Edit(3, "alloc-audit: tier=T2 arena", "tier")])
    assert out == newline.join([b"void f() {", b"  int x;", b"    // alloc-audit: tier=T2 arena",
                                b"    CHECK(cudaMalloc(&p,", b"                     n));", b"}", b""])


def test_cli_annotate_site_and_decisions_file(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {
        "eng/kv.py": 'import torch\n\n\ndef pool(n):\n    return torch.zeros(\n        n, device="cuda")\n',
        "eng/ws.cu": "void grow(size_t n) {\n  if (n > cap) {\n    cudaMalloc(&buf, n);\n  }\n}\n",
    })
    result = run_cli("annotate", "--site", "eng/kv.py:6", "--tier", "T3", "--reason", "pooled KV slab", cwd=root)
    assert result.code == 0, result.err
    assert (root / "eng/kv.py").read_text().splitlines()[4] == "    # alloc-audit: tier=T3 pooled KV slab"
    write(root, "decisions.json", '{"decisions": [{"site": "eng/ws.cu:3", "ignore": "grow-on-demand", '
                                  '"reason": "warm-up only"}]}')
    assert run_cli("annotate", "--decisions", "decisions.json", cwd=root).code == 0
    assert "    // alloc-audit: ignore[grow-on-demand] warm-up only\n    cudaMalloc" in (root / "eng/ws.cu").read_text()
    scan = run_cli("scan", "--format", "json", "--no-cache", cwd=root)
    assert '"tier": "T3"' in scan.out and "annotated at line 5: pooled KV slab" in scan.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--site", "eng/kv.py:6", "--tier", "T3"], "needs a reason", id="no reason"),
        pytest.param(["--site", "eng/kv.py:6", "--tier", "T9", "--reason", "x"], "unknown tier", id="bad tier"),
        pytest.param(["--site", "eng/kv.py:6", "--ignore", "nope", "--reason", "x"], "unknown rule", id="bad rule"),
        pytest.param(["--site", "missing.py:1", "--tier", "T2", "--reason", "x"], "no such file", id="no file"),
    ],
)
def test_cli_annotate_refuses_bad_decisions(tmp_path: Path, args: list[str], message: str) -> None:
    root = make_repo(tmp_path / "p", {"eng/kv.py": 'import torch\n\n\ndef pool(n):\n    return torch.zeros(n, device="cuda")\n'})
    before = (root / "eng/kv.py").read_bytes()
    result = run_cli("annotate", *args, cwd=root)
    assert result.code == 2 and message in result.err
    assert (root / "eng/kv.py").read_bytes() == before


def _drive(cmd: list[str], cwd: Path, answers: list[tuple[str, str]], timeout: float = 30.0) -> str:
    """Run a command on a pseudo-terminal, answering each prompt when it appears."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "LINES": "40", "TERM": "xterm"}
    proc = subprocess.Popen(cmd, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    seen = b""
    pending = list(answers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        if pending and pending[0][0].encode() in seen.split(b"\n")[-1] + seen[-200:]:
            prompt, answer = pending.pop(0)
            seen += b"\n<<" + prompt.encode() + b">>\n"
            os.write(master, answer.encode() + b"\r")
        if proc.poll() is not None and not ready:
            break
    proc.wait(timeout=10)
    os.close(master)
    return seen.decode("utf-8", "replace")


def test_audit_walks_sites_through_a_terminal(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"eng/kv.py": (
        'import torch\n\n\ndef pool(n):\n    return torch.zeros(n, device="cuda")\n\n\n'
        'def scratch(n):\n    return torch.empty(n, device="cuda").sum()\n')})
    (root / "allowlists").mkdir()
    (root / "allowlists" / "alloc-audit.allowlist").write_text("# alloc-audit allowlist v1\n")
    out = _drive([*cli_command(), "audit"], root, [
        ("[a]ccept", "t"), ("tier", "T3"), ("reason", "the KV slab"),
        ("[a]ccept", "a"), ("reason", "per-step scratch"),
    ])
    assert "[1/2] eng/kv.py:5" in out and "proposed tier: T4" in out
    text = (root / "eng/kv.py").read_text()
    assert "    # alloc-audit: tier=T3 the KV slab\n    return torch.zeros" in text
    allowlist = (root / "allowlists" / "alloc-audit.allowlist").read_text()
    assert "eng/kv.py pool torch.zeros T3 # the KV slab" in allowlist
    assert "eng/kv.py scratch torch.empty T4 # per-step scratch" in allowlist
    assert run_cli("check", cwd=root).code == 0
