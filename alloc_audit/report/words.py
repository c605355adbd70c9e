"""Counts in words, the same in every format and command: '1 site',
'2 sites', '1 entry', '3 entries'."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` with ``noun`` in the right number (``many``: an irregular plural)."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"
