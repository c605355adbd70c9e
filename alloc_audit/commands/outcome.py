"""What a command hands back to the CLI: never printed by the command itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError

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


def written(text: str, output: Path | None, summary: str, failed: bool) -> Text:
    """A report for stdout, or written atomically to ``output`` with a
    one-line summary for stdout instead (``--output``)."""
    if output is None:
        return Text(text, failed=failed)
    from ..atomic import atomic_write_bytes

    try:
        atomic_write_bytes(output, text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write report: {exc.strerror}", str(output)) from None
    return Text(f"{summary}; report written to {output}\n", failed=failed)
