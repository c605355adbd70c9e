"""What a command hands back to the CLI: never printed by the command itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..report.context import ReportContext


@dataclass(frozen=True)
class Report:
    """A scan to render in the format the user asked for (scan, report)."""

    ctx: ReportContext
    summary: str  # one line, printed when the report goes to a file
    failed: bool = False


@dataclass(frozen=True)
class Text:
    """Text for stdout and for stderr, whether the command failed (exit 1),
    and whether it was interrupted (exit 130; `audit` keeps what was saved)."""

    out: str = ""
    err: str = ""
    failed: bool = False
    interrupted: bool = False
