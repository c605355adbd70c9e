"""Stage 8, report: a ScanResult -> text in one format. One module per
format; renderers return strings and never print (only cli.py prints)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..commands.join import JoinOutcome
    from .context import ReportContext


class Format(str, Enum):
    """The report formats (one module each, but ``table``: ``terminal``)."""

    table = "table"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"
    html = "html"
    github = "github"


class JoinFormat(str, Enum):
    """The formats of ``alloc-audit join`` (modules ``join_text``, ``join_json``, ``join_html``)."""

    table = "table"
    json = "json"
    markdown = "markdown"
    html = "html"


class Pivot(str, Enum):
    """What the report's main table is pivoted by."""

    dir = "dir"
    file = "file"
    tier = "tier"
    rule = "rule"
    api = "api"


_EXTENSIONS = {".html": Format.html, ".htm": Format.html, ".md": Format.markdown, ".markdown": Format.markdown,
               ".sarif": Format.sarif, ".json": Format.json, ".txt": Format.table}


def format_for(fmt: Format | None, output: Path | None) -> Format:
    """The format asked for, or the one the output file's extension names
    (``report -o report.html``); a contradiction, or an extension that names
    no format when none was given, is refused rather than writing, say, a
    terminal table into an .html file."""
    from ..errors import UsageError

    implied = None
    if output is not None:
        name = output.name.lower()
        implied = Format.sarif if name.endswith(".sarif.json") else _EXTENSIONS.get(Path(name).suffix)
    if fmt is None:
        if output is not None and implied is None:
            raise UsageError(f"cannot tell the format from the file name; give --format "
                             f"({', '.join(f.value for f in Format)}) or use one of the extensions "
                             f"{', '.join(sorted(_EXTENSIONS))}", str(output))
        return implied or Format.table
    if implied is not None and implied is not fmt:
        raise UsageError(f"--format {fmt.value} does not match the file's extension, which means {implied.value}; "
                         "drop --format or rename the file", str(output))
    return fmt


def render(fmt: str, ctx: ReportContext, command: str = "scan", color: bool = False) -> str:
    """``fmt``: table, json, sarif, markdown, html or github; ``command``
    picks the terminal table (scan's census or report's overview)."""
    if fmt == "json":
        from . import json as json_report

        return json_report.render(ctx)
    if fmt == "sarif":
        from . import sarif

        return sarif.render(ctx)
    if fmt == "markdown":
        from . import markdown

        return markdown.render(ctx)
    if fmt == "html":
        from . import html

        return html.render(ctx)
    if fmt == "github":
        from . import github

        return github.render(ctx)
    from . import terminal

    if command == "report":
        return terminal.render_report(ctx, color)
    return terminal.render_scan(ctx, color)


def render_join(fmt: str, outcome: JoinOutcome, color: bool = False, width: int | None = None) -> str:
    """``alloc-audit join``'s outcome in ``fmt``: table, json, markdown or html."""
    if fmt == "json":
        from . import join_json

        return join_json.render(outcome)
    if fmt == "html":
        from . import join_html

        return join_html.render(outcome)
    from . import join_text

    if fmt == "markdown":
        return join_text.render_markdown(outcome)
    return join_text.render_terminal(outcome, color, width)
