"""What the terminal is like (colour, width) and the progress bar shown on
it during long scans. The CLI asks; renderers receive plain values."""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def color() -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return sys.stdout.isatty()


def width() -> int | None:
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size((100, 24)).columns
    env = os.environ.get("COLUMNS")
    return int(env) if env and env.isdigit() else None


class ProgressBar:
    """A rich progress bar on stderr that appears only when a scan takes
    longer than a moment (0.5 s; ALLOC_AUDIT_PROGRESS_DELAY overrides it),
    and only on a terminal."""

    def __init__(self) -> None:
        try:
            self._delay = float(os.environ.get("ALLOC_AUDIT_PROGRESS_DELAY", "0.5"))
        except ValueError:
            self._delay = 0.5
        self._start = time.monotonic()
        self._progress: Any = None
        self._task: Any = None

    @staticmethod
    def wanted() -> bool:
        """Never in piped output: both streams must be a terminal."""
        return sys.stderr.isatty() and sys.stdout.isatty()

    def update(self, done: int, total: int) -> None:
        if self._progress is None:
            if time.monotonic() - self._start < self._delay or done >= total:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)
            self._progress.start()
            self._task = self._progress.add_task("scan", total=total)
        self._progress.update(self._task, completed=done, total=total)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._start = float("inf")  # never again in this run
