"""UsageError: the one exception meant for users (bad config, bad allowlist,
bad arguments). ``cli.py`` catches it once, prints ``path:line: message`` and
exits 2 without writing anything. Problems with scanned files are never
exceptions: they are ``FileError`` values (see ``model.py``)."""

from __future__ import annotations

from pathlib import Path


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
