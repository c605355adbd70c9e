"""UsageError: the one exception meant for users (bad config, bad allowlist,
bad arguments). ``cli.py`` catches it once, prints ``path:line: message`` and
exits 2 without writing anything. Problems with scanned files are never
exceptions: they are ``FileError`` values (see ``model.py``)."""

from __future__ import annotations

from pathlib import Path

# Exit codes (README "Exit codes"; chosen in cli.py alone).
OK, FAILED, USAGE, INTERNAL_ERROR = 0, 1, 2, 3
# no public tracker URL yet: the lead fills it in when there is one
REPORT_TO = "the alloc-audit issue tracker"


def internal_error_message(exc: BaseException) -> str:
    """What a user sees when alloc-audit itself breaks: not their code's fault,
    and where to send it."""
    return (f"alloc-audit: internal error ({type(exc).__name__}: {exc}). This is a bug in alloc-audit, not a "
            f"problem in your code. Please report it to {REPORT_TO} with the command line and the output of the "
            f"same command with --debug (exit code {INTERNAL_ERROR}).")


def display_path(path: Path, root: Path) -> str:
    """How a user file (config, allowlist) is named in messages: relative
    to the project root when inside it."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


class UsageError(Exception):
    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line

    def __str__(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        return f"{where}{self.message}"
