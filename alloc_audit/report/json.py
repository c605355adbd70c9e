"""The ``alloc-audit/1`` JSON document (DESIGN.md, "JSON output"): sorted and
byte-identical across runs on the same input, ``stats.seconds`` excepted."""

from __future__ import annotations

import json
from typing import Any

from .. import __version__
from ..model import Finding, Site
from ..ratchet.keys import key_text, site_key
from .context import ReportContext
from .summary import sizes

SCHEMA = "alloc-audit/1"


def site_json(site: Site, allowlisted: bool | None, size: int | None = None) -> dict[str, Any]:
    return {
        "path": site.path,
        "line": site.span.line,
        "col": site.span.col,
        "end_line": site.span.end_line,
        "end_col": site.span.end_col,
        "language": site.language.value,
        "api": site.api,
        "kind": site.kind.value,
        "scope": site.scope,
        "tier": site.tier.value,
        "tier_reason": site.tier_reason,
        "size": site.size,
        "shape": list(site.shape),
        "dtype": site.dtype,
        "device": site.device,
        "target": site.target,
        "bytes": size,
        "key": key_text(site_key(site)),
        "allowlisted": allowlisted,
        "role": site.role,
        "via": None if site.via is None else {"api": site.via.api, "path": site.via.path, "line": site.via.line},
    }


def finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "rule": finding.rule,
        "severity": finding.severity.value,
        "path": finding.path,
        "line": finding.line,
        "col": finding.col,
        "scope": finding.scope,
        "message": finding.message,
        "related": [{"path": r.path, "line": r.line, "note": r.note} for r in finding.related],
        "key": finding.key,
        "suppressed": finding.suppressed,
        "role": finding.role,
    }


def document(ctx: ReportContext) -> dict[str, Any]:
    result = ctx.result
    known = sizes(ctx)
    unanalysed = set(result.unchecked)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "tool": {"name": "alloc-audit", "version": __version__},
        "root": ctx.root_display,
        "stats": {
            "files": result.stats.files,
            "parsed": result.stats.parsed,
            "parse_errors": result.stats.parse_errors,
            "seconds": round(result.stats.seconds, 3),
        },
        # analysed: false when the file's sites are unknown (not read, or
        # its analysis failed); true when it was read around the problem
        "errors": [{"path": e.path, "message": e.message, "analysed": e not in unanalysed} for e in result.errors],
        "sites": [site_json(s, ctx.allowlisted(s), known.get(id(s))) for s in result.sites],
        "findings": [finding_json(f) for f in result.findings],
    }
    if ctx.allowlist is not None:
        doc["allowlist"] = ctx.allowlist_json()
    return doc


def render(ctx: ReportContext) -> str:
    return json.dumps(document(ctx), indent=2, ensure_ascii=False, sort_keys=False) + "\n"
