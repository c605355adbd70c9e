"""GitHub workflow commands: one ``::error``/``::warning`` line per open
finding, per allowlist failure and per file that could not be analysed,
which GitHub shows as annotations on the PR's diff. The same lines ``check
--format github`` and ``gate --format github`` print (report/checks.py
builds them)."""

from __future__ import annotations

from ..ratchet.checks import Problem, allowlist_problems, finding_problems
from ..ratchet.checks import render as render_problems
from .context import ReportContext


def render(ctx: ReportContext) -> str:
    problems = finding_problems(ctx.result.findings, fail_warnings=False)
    if ctx.allowlist is not None:
        problems += allowlist_problems(ctx.allowlist)
    problems += [Problem(e.path, 1, "warning", "file not analysed", e.message) for e in ctx.result.errors]
    problems.sort(key=lambda p: (p.path, p.line, p.title, p.message))
    return render_problems(problems, "github")
