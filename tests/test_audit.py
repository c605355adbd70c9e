"""`alloc-audit audit` in a real pseudo-terminal: each decision is saved as
it is made, a blank reason asks again, Ctrl-C (a real ^C through the
terminal's line discipline) keeps what was done and says so, and a second
walk carries on where the first stopped. Without a terminal it says why."""

from __future__ import annotations

import os
import platform
import pty
import re
import select
import signal
import sys
import termios
import time
from pathlib import Path

import pytest
from clihelp import cli_command, make_repo, run_cli, write

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")

ENGINE = '''
import torch


def first(n):
    return torch.empty(n, device="cuda")


def second(n):
    out = torch.zeros(n, device="cuda")
    return out


def third(n):
    return torch.ones(n, device="cuda")
'''
HEADER = "# alloc-audit allowlist v1\n"
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """The CLI on a pty of its own (pty.fork: the pty is its controlling
    terminal, so ^C is delivered as SIGINT by the kernel, as at a shell)."""

    def __init__(self, cwd: Path, *args: str) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child
            # started as a shell starts a job: SIGINT at its default and no
            # signal blocked, whatever this test process inherited
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.chdir(cwd)
            os.environ.update({"NO_COLOR": "1", "COLUMNS": "100", "TERM": "dumb"})
            command = [*cli_command(), *args]
            os.execvp(command[0], command)
        self.pid, self.fd = pid, fd
        self.seen = b""

    def expect(self, text: str, timeout: float = 60.0) -> str:
        """Wait for ``text``; returns what came before it and keeps what came after."""
        deadline = time.monotonic() + timeout
        while text not in self.text():
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out waiting for {text!r}; the terminal shows:\n{self.text()[-2000:]}"
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                assert chunk or text in self.text(), f"exited before {text!r}:\n{self.text()}"
                self.seen += chunk
        shown = self.text()
        at = shown.index(text) + len(text)
        self.seen = shown[at:].encode()
        return shown[:at]

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def interrupt(self, timeout: float = 60.0) -> None:
        """^C once the child sits in read(2) on the terminal. A SIGINT that
        lands after the prompt is printed but before the blocking read starts
        only sets Python's flag, and the read then waits for more input (the
        race behind a 1-in-4 hang under load); a person at a prompt never
        types that fast. Where /proc cannot say, a short pause stands in."""
        read_syscall = {"x86_64": "0", "aarch64": "63"}.get(platform.machine())
        deadline = time.monotonic() + timeout
        while not self._reading_terminal(read_syscall):
            assert time.monotonic() < deadline, f"never came to read the terminal:\n{self.text()[-2000:]}"
            time.sleep(0.01)
        self.send("\x03")

    def _reading_terminal(self, read_syscall: str | None) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/syscall").read_text().split()
        except OSError:
            state = []
        if read_syscall is None or not state:
            time.sleep(0.5)  # no /proc to ask
            return True
        return state[:2] == [read_syscall, "0x0"]

    def _process_state(self) -> str:
        """What the kernel says of a child that does not end: its syscall, its
        threads and its signal masks (pending, blocked, ignored, caught), so
        a hang explains itself in the failure."""
        try:
            syscall = Path(f"/proc/{self.pid}/syscall").read_text().split()[:2]
            status = Path(f"/proc/{self.pid}/status").read_text().splitlines()
        except OSError:
            return "unknown (no /proc)"
        keep = ("State", "Threads", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        return (f"syscall {' '.join(syscall)}; " + "; ".join(line for line in status if line.startswith(keep))
                + f"; {self._terminal_state()}")

    def _terminal_state(self) -> str:
        """Whether ^C can reach the child at all: the terminal's foreground
        process group (a ^C goes to it) and its ISIG/ICANON flags."""
        try:
            foreground = os.tcgetpgrp(self.fd)
            lflag = termios.tcgetattr(self.fd)[3]
        except OSError as exc:
            return f"terminal state unknown ({exc})"
        flags = [name for name in ("ISIG", "ICANON", "ECHO") if lflag & getattr(termios, name)]
        return f"terminal foreground group {foreground} (child {self.pid}), lflags {' '.join(flags) or 'none'}"

    def text(self) -> str:
        return ANSI.sub(b"", self.seen).replace(b"\r", b"").decode("utf-8", "replace")

    def wait(self, timeout: float = 60.0) -> int:
        """The exit code; a child still running after ``timeout`` is killed and fails the test."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                state = self._process_state()
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise AssertionError(f"still running after {timeout} s; the process was: {state}; "
                                     f"the terminal shows:\n{self.text()[-2000:]}")
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            self.seen += chunk
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def project(tmp_path: Path) -> Path:
    root = make_repo(tmp_path / "proj", {"eng/ops.py": ENGINE})
    write(root, "allowlists/alloc-audit.allowlist", HEADER)
    return root


def test_audit_saves_as_it_goes_and_keeps_work_on_ctrl_c(tmp_path: Path) -> None:
    root = project(tmp_path)
    term = Terminal(root, "audit")
    term.expect("[1/3] eng/ops.py:5")
    term.expect("[a]ccept")
    term.send("a\r")
    term.expect("reason: ")
    term.send("\r")  # blank: asked again, not an abort
    term.expect("a reason is required")
    term.expect("reason: ")
    term.send("warm-up buffer\r")
    term.expect("saved: accepted eng/ops.py:5 torch.empty in first")
    allowlist = (root / "allowlists" / "alloc-audit.allowlist").read_text()
    assert "eng/ops.py first torch.empty T4 # warm-up buffer" in allowlist, "saved before the next question"

    term.expect("[2/3] eng/ops.py:9")
    term.send("t\r")
    term.expect("tier")
    term.send("T2\r")
    term.expect("reason")
    term.send("kept by the caller\r")
    term.expect("saved: annotated eng/ops.py:9: # alloc-audit: tier=T2 kept by the caller")
    assert "    # alloc-audit: tier=T2 kept by the caller\n    out = torch.zeros" in (root / "eng/ops.py").read_text()

    # the annotation moved the third site down a line: the walk knows
    term.expect("[3/3] eng/ops.py:15")
    term.expect("[a]ccept")
    term.interrupt()  # Ctrl-C, through the terminal, once it is reading
    code = term.wait()
    assert code == 130
    assert "interrupted after 2 of 3 sites; 2 decisions already saved and kept" in term.text()
    allowlist = (root / "allowlists" / "alloc-audit.allowlist").read_text()
    assert "eng/ops.py second torch.zeros T2 # kept by the caller" in allowlist

    again = Terminal(root, "audit")
    again.expect("[1/1] eng/ops.py:15")
    again.expect("[a]ccept")
    again.send("q\r")
    assert again.wait() == 0
    assert "reviewed 0 of 1 site; 0 decisions saved" in again.text()


def test_end_of_input_stops_like_ctrl_c(tmp_path: Path) -> None:
    root = project(tmp_path)
    term = Terminal(root, "audit")
    term.expect("[a]ccept")
    term.send("\x04")  # Ctrl-D at the prompt
    assert term.wait() == 130
    assert "interrupted after 0 of 3 sites; 0 decisions already saved and kept" in term.text()


def test_audit_without_a_terminal_says_it_needs_one(tmp_path: Path) -> None:
    root = project(tmp_path)
    result = run_cli("audit", cwd=root)
    assert result.code == 2
    assert "needs a terminal" in result.err and "Aborted" not in result.err + result.out
    assert "annotate --decisions" in result.err
