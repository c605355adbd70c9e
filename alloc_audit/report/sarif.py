"""SARIF 2.1.0 for code-scanning platforms (GitHub code scanning, the VS
Code SARIF viewer, ``sarif-tools``).

- every rule (and the meta rules, and the allowlist checks) with its
  documentation: ``shortDescription``, ``fullDescription``, ``help`` with
  Markdown;
- one result per finding, with ``relatedLocations``; suppressed findings are
  kept, with ``suppressions`` saying why;
- when the project has an allowlist, one result per site not on it and per
  stale entry, so a PR shows the new site where it was added;
- ``partialFingerprints`` derived from the finding's allowlist-style key
  (path, scope, api), not its line, so platforms follow a finding across
  commits that move it;
- files that could not be read or parsed as tool notifications.

URIs are relative to the repository root (``%SRCROOT%``), which is what
code-scanning uploads expect, even when the project root is a subdirectory.
Deterministic: no timestamps, no absolute paths.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import __version__
from ..model import Finding, Severity, Site
from ..ratchet.keys import key_text, site_key
from .context import ReportContext
from .summary import counted

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
FINGERPRINT = "allocAudit/v1"

NEW_SITE = "new-allocation-site"
STALE_ENTRY = "stale-allowlist-entry"
_ALLOWLIST_RULES = (
    (NEW_SITE, Severity.ERROR, "An allocation site that the allowlist does not accept.",
     "The allowlist is a ratchet: it records the allocation sites that exist today, with a reason each, and may "
     "only shrink. A site that is not on it is new debt.\n\n"
     "**Fix:** move the allocation into a planned tier (a persistent buffer sized at start-up, the KV pool, the "
     "scratch plan), or accept it after review with `alloc-audit allowlist update --add-new` and write the "
     "reason in the entry."),
    (STALE_ENTRY, Severity.ERROR, "An allowlist entry that matches no allocation site any more.",
     "An entry whose site was removed or moved keeps a free place on the allowlist that a new site could take "
     "unnoticed.\n\n**Fix:** `alloc-audit allowlist update` removes stale entries and lowers counts."),
)


def repo_prefix(root: Path) -> str:
    """The project root relative to the enclosing git work tree ('' when it
    is the top, or when there is no work tree)."""
    root = root.resolve()
    for directory in (root, *root.parents):
        if (directory / ".git").exists():
            rel = root.relative_to(directory).as_posix()
            return "" if rel == "." else rel + "/"
    return ""


def _fingerprint(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()[:32]


def _first_paragraph(doc: str) -> str:
    """The first paragraph of prose (headings dropped): what the rule flags."""
    for block in doc.strip().split("\n\n"):
        lines = [line for line in block.splitlines() if not line.lstrip().startswith("#")]
        text = " ".join(" ".join(lines).split())
        if text and not text.startswith("```"):
            return text
    return ""


def _level(severity: Severity) -> str:
    return {Severity.ERROR: "error", Severity.WARNING: "warning"}.get(severity, "note")


def rule_descriptors() -> list[dict[str, Any]]:
    from ..rules import ALL_RULES

    out = []
    for rule in ALL_RULES:
        out.append(_descriptor(rule.name, rule.severity, rule.summary, rule.doc, rule.default_on))
    for name, severity, summary, doc in _ALLOWLIST_RULES:
        out.append(_descriptor(name, severity, summary, doc, True))
    return out


def _descriptor(name: str, severity: Severity, summary: str, doc: str, enabled: bool) -> dict[str, Any]:
    return {
        "id": name,
        "name": "".join(part.capitalize() for part in name.split("-")),
        "shortDescription": {"text": summary},
        "fullDescription": {"text": _first_paragraph(doc) or summary},
        "help": {"text": doc.strip() or summary, "markdown": doc.strip() or summary},
        "defaultConfiguration": {"level": _level(severity), "enabled": enabled},
        "properties": {"tags": ["gpu-memory", "allocation"], "precision": "high"},
    }


class _Builder:
    def __init__(self, ctx: ReportContext) -> None:
        self.ctx = ctx
        self.prefix = repo_prefix(ctx.result.root)
        self.rules = rule_descriptors()
        self.index = {r["id"]: i for i, r in enumerate(self.rules)}
        self.seen: dict[str, int] = {}

    def location(self, path: str, line: int, col: int | None = None, end_line: int | None = None,
                 end_col: int | None = None) -> dict[str, Any]:
        region: dict[str, Any] = {"startLine": max(line, 1)}
        if col:
            region["startColumn"] = col
        if end_line and end_line >= line:
            region["endLine"] = end_line
            if end_col and (end_line > line or (col and end_col > col)):
                region["endColumn"] = end_col
        return {"physicalLocation": {
            "artifactLocation": {"uri": self.prefix + path, "uriBaseId": "%SRCROOT%"},
            "region": region,
        }}

    def fingerprint(self, *parts: str) -> dict[str, str]:
        base = _fingerprint(*parts)
        n = self.seen.get(base, 0)
        self.seen[base] = n + 1
        return {FINGERPRINT: base if n == 0 else f"{base}:{n}"}

    def result(self, rule: str, level: str, message: str, location: dict[str, Any],
               fingerprint: dict[str, str]) -> dict[str, Any]:
        return {
            "ruleId": rule,
            "ruleIndex": self.index[rule],
            "level": level,
            "message": {"text": message},
            "locations": [location],
            "partialFingerprints": fingerprint,
        }

    def finding(self, f: Finding) -> dict[str, Any]:
        out = self.result(f.rule, _level(f.severity), f.message, self.location(f.path, f.line, f.col),
                          self.fingerprint(f.rule, f.key or f"{f.path} {f.scope}"))
        if f.related:
            out["relatedLocations"] = [
                {"id": i, **self.location(r.path, r.line), "message": {"text": r.note}}
                for i, r in enumerate(f.related, 1)
            ]
            # the witness path, trigger first, ending at the finding: a code
            # flow a SARIF viewer can step through (issue 16)
            steps = [{"location": {**self.location(r.path, r.line), "message": {"text": r.note}}}
                     for r in f.related]
            steps.append({"location": {**self.location(f.path, f.line, f.col), "message": {"text": f.rule}}})
            out["codeFlows"] = [{"threadFlows": [{"locations": steps}]}]
        if f.role != "production":
            out["properties"] = {"role": f.role}
        if f.suppressed is not None:
            out["suppressions"] = [{"kind": "inSource", "status": "accepted", "justification": f.suppressed}]
        return out

    def new_site(self, site: Site) -> dict[str, Any]:
        key = site_key(site)
        message = (f"{site.api} in {site.scope} ({site.tier.value}, {site.kind.value}) is not on the allowlist: "
                   "move it to a planned tier, or accept it with `alloc-audit allowlist update --add-new` "
                   "and a reason")
        s = site.span
        return self.result(NEW_SITE, "error", message, self.location(site.path, s.line, s.col, s.end_line, s.end_col),
                           self.fingerprint(NEW_SITE, key_text(key)))

    def stale(self, entry: Any) -> dict[str, Any]:
        message = f"{key_text(entry.key)} matches no site; delete it with `alloc-audit allowlist update`"
        return self.result(STALE_ENTRY, "error", message, self.location(entry.file, entry.line or 1),
                           self.fingerprint(STALE_ENTRY, key_text(entry.key)))


def document(ctx: ReportContext) -> dict[str, Any]:
    b = _Builder(ctx)
    results: list[dict[str, Any]] = [b.finding(f) for f in ctx.result.findings]
    comparison = ctx.allowlist
    if comparison is not None:
        results += [b.new_site(s) for _, sites in comparison.new for s in sites]
        results += [b.stale(e) for e in comparison.stale]
    notifications = [
        {"level": "warning", "message": {"text": e.message}, "locations": [b.location(e.path, 1)]}
        for e in ctx.result.errors
    ]
    invocation: dict[str, Any] = {"executionSuccessful": True}
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    return {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "alloc-audit",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": b.rules,
            }},
            "invocations": [invocation],
            "originalUriBaseIds": {"%SRCROOT%": {"description": {"text": "The root of the git work tree."}}},
            "columnKind": "unicodeCodePoints",
            "results": results,
            "properties": {"sites": _site_counts(ctx.result.sites)},
        }],
    }


def _site_counts(sites: Iterable[Site]) -> dict[str, int]:
    return dict(sorted(Counter(s.tier.value for s in counted(sites)).items()))


def render(ctx: ReportContext) -> str:
    return json.dumps(document(ctx), indent=2, ensure_ascii=False) + "\n"
