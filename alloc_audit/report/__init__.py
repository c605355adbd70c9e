"""Stage 8, report: a ScanResult -> text in one format. One module per
format; renderers return strings and never print (only cli.py prints)."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import ReportContext


class Format(str, Enum):
    """The report formats (one module each, but ``table``: ``terminal``)."""

    table = "table"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"
    html = "html"
    github = "github"


class Pivot(str, Enum):
    """What the report's main table is pivoted by."""

    dir = "dir"
    file = "file"
    tier = "tier"
    rule = "rule"
    api = "api"


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
