"""The ``alloc-audit-join/1`` JSON document of ``alloc-audit join``
(docs/join.md). Sorted and byte-identical across runs on the same input:
record paths as given, times relative to the first trace event, no clock."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..model import TIER_NAMES, Tier
from ..runtime.results import Join, Usage

if TYPE_CHECKING:
    from ..commands.join import JoinOutcome

SCHEMA = "alloc-audit-join/1"


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "live_bytes": u.live_bytes,
        "live_blocks": u.live_blocks,
        "live_in_graph_pools": u.live_in_graph_pools,
        "peak_bytes": u.peak_bytes,
        "allocs": u.allocs,
        "bytes_allocated": u.bytes_allocated,
        "frees": u.frees,
        "median_lifetime_us": u.median_lifetime_us,
        "churn_per_step": u.churn_per_step,
        "capture_allocs": u.capture_allocs,
        "capture_bytes": u.capture_bytes,
        "streams": list(u.streams),
        "phases": list(u.phases),
        "grew": u.grew,
    }


def tier_label(tier: str) -> str:
    try:
        return TIER_NAMES[Tier(tier)]
    except ValueError:
        return tier


def join_json(j: Join, min_accounted: float | None) -> dict[str, Any]:
    implicit_live = sum(p.usage.live_bytes for p in j.implicit)
    return {
        "records": [{
            "path": s.path, "stacks": s.stacks, "segments": s.segments, "blocks": s.blocks, "events": s.events,
            "reserved_bytes": s.reserved, "allocated_bytes": s.allocated, "steps": s.steps,
            "history_truncated": s.truncated, "unknown_actions": dict(s.unknown_actions),
        } for s in j.snapshots],
        "summary": {
            "live_bytes": j.live,
            "reserved_bytes": j.reserved,
            "accounted_bytes": j.accounted,
            "accounted_share": round(j.accounted_share, 2),
            "implicit_bytes": implicit_live,
            "frames_mapped": j.frames_mapped,
            "frames_total": j.frames_total,
            "steps": j.steps,
            "min_accounted": min_accounted,
            "passed": min_accounted is None or j.accounted_share >= min_accounted,
        },
        "buckets": [{"name": b.name, "bytes": b.bytes, "note": b.note} for b in j.buckets],
        "tiers": [{"tier": t, "name": tier_label(t), "live_bytes": live, "peak_bytes": peak}
                  for t, live, peak in j.tiers],
        "sites": [{
            "path": s.site.path, "line": s.site.span.line, "end_line": s.site.span.end_line, "api": s.site.api,
            "kind": s.site.kind.value, "scope": s.site.scope, "tier": s.site.tier.value,
            "via": None if s.site.via is None else f"{s.site.via.path}:{s.site.via.line}",
            "match": s.how or None, "observed": s.observed, "verdict": s.verdict, "note": s.note,
            "runtime": usage_json(s.usage),
        } for s in j.sites],
        "implicit": [{"path": p.path, "line": p.line, "function": p.function, "runtime": usage_json(p.usage)}
                     for p in j.implicit],
        "findings": [{
            "rule": f.rule, "severity": f.severity, "path": f.path, "line": f.line, "scope": f.scope,
            "message": f.message, "status": f.status, "runtime": dict(f.runtime),
        } for f in j.findings],
        "pools": [{"pool": list(p.pool), "reserved_bytes": p.reserved, "live_bytes": p.live,
                   "capture_bytes": p.capture_bytes, "functions": list(p.functions)} for p in j.pools],
        "timeline": {"tiers": [t for t, _, _ in j.tiers],
                     "points": [[time, list(values)] for time, values in j.timeline]},
    }


def document(outcome: JoinOutcome) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "tool": {"name": "alloc-audit", "version": __version__},
        "root": outcome.root_display,
        "passed": outcome.passed,
        "snapshot": join_json(outcome.snapshot, outcome.min_accounted) if outcome.snapshot else None,
        "native": join_json(outcome.native, None) if outcome.native else None,
        "errors": [{"path": e.path, "message": e.message} for e in outcome.errors],
    }


def render(outcome: JoinOutcome) -> str:
    return json.dumps(document(outcome), indent=2, sort_keys=False) + "\n"
