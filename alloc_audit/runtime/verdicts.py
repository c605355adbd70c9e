"""Runtime, verdicts: a site's observed lifetime against its tier, and the
static findings confirmed, or not, by what the run did (part of :mod:`.join`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..model import TIER_NAMES, Finding, Site, SiteKind, Tier
from .match import Matcher, _last
from .results import LOAD_PHASES, Join, JoinedSite, RuntimeFinding, Usage

# ---------------------------------------------------------------- verdicts

PERSISTENT = frozenset({Tier.T1, Tier.T2, Tier.T3})

_PLACE = re.compile(r"([\w./-]+\.\w+):(\d+)")


def verdict(site: Site, u: Usage, how: str, matcher: Matcher, steps: int, via_reached: bool,
             source: str) -> JoinedSite:
    if site.kind is SiteKind.GRAPH_POOL:
        return JoinedSite(site, "", u, "not visible", "not-visible",
                          "a pool handle allocates nothing itself; its memory shows as capture allocations per pool")
    if site.kind not in matcher.kinds:
        what = "host memory" if site.kind is SiteKind.PINNED_HOST else f"{site.kind.value} memory"
        return JoinedSite(site, "", u, "not visible", "not-visible",
                          f"{what} is not in a PyTorch memory snapshot" if source == "snapshot"
                          else f"{what} is not in this native record")
    if not u.reached and source == "native" and site.language.value == "python" \
            and site.kind in (SiteKind.DEVICE, SiteKind.WORKSPACE):
        return JoinedSite(site, "", u, "not visible", "not-visible",
                          "PyTorch's allocator hands this memory out: see the snapshot, not the native record")
    if not u.reached:
        if via_reached:
            return JoinedSite(site, "", u, "through other sites", "agrees",
                              "its bytes are attributed to the derived sites on the same stacks")
        return JoinedSite(site, "", u, "not reached", "not-reached")
    per_step = steps > 0 and u.churn_per_step is not None and u.churn_per_step >= 1.0
    default_live = u.live_bytes - u.live_in_graph_pools
    if u.live_bytes > 0:
        observed = "alive at end" + (" (graph pool)" if default_live == 0 else "")
    elif per_step:
        observed = "per step"
    else:
        observed = "freed"
    if site.tier in PERSISTENT:
        if u.live_bytes == 0:
            return JoinedSite(site, how, u, observed, "disagrees",
                              f"a {site.tier.value} site whose blocks were all freed before the snapshot"
                              + (f" ({u.churn_per_step} allocations per step)" if per_step else ""))
        if per_step:
            return JoinedSite(site, how, u, observed, "disagrees",
                              f"a {site.tier.value} site allocating every step ({u.churn_per_step} per step)")
        if site.tier is Tier.T1 and u.late_allocs:
            return JoinedSite(site, how, u, observed, "disagrees",
                              f"a T1 site allocating after load ({u.late_allocs} allocations in "
                              f"{', '.join(p for p in u.phases if p not in LOAD_PHASES)})")
        return JoinedSite(site, how, u, observed, "agrees")
    if site.tier is Tier.T4:
        if default_live > 0:
            return JoinedSite(site, how, u, observed, "disagrees",
                              f"a T4 (forward-scratch) site with {default_live} bytes alive at the end")
        return JoinedSite(site, how, u, observed, "agrees",
                          "alive only in a CUDA-graph pool, which the graph owns" if u.live_bytes else "")
    if site.tier in (Tier.T5A, Tier.T5B):
        return JoinedSite(site, how, u, observed, "agrees",
                          "pinned host memory, seen in the native record (kept by the host allocator's cache)")
    return JoinedSite(site, how, u, observed, "no-tier", f"tier {site.tier.value}: nothing to compare with")


def _usage_at(result: Join, path: str, line: int) -> JoinedSite | None:
    """The joined site at ``path:line``; when its bytes went to derived sites
    (``self.buf = self._make_buffer(...)``), their usage summed."""
    for j in result.sites:
        s = j.site
        if s.path == path and min(s.stmt_line or s.span.line, s.span.line) <= line <= s.span.end_line:
            if j.usage.reached or j.verdict != "agrees":
                return j
            derived = [d.usage for d in result.sites if d.site.via is not None and d.site.via.path == s.path
                       and d.site.via.line == s.span.line]
            return JoinedSite(s, j.how, _sum(derived), j.observed, j.verdict, j.note)
    return None


def _sum(usages: list[Usage]) -> Usage:
    return Usage(
        live_bytes=sum(u.live_bytes for u in usages), live_blocks=sum(u.live_blocks for u in usages),
        peak_bytes=sum(u.peak_bytes for u in usages), allocs=sum(u.allocs for u in usages),
        bytes_allocated=sum(u.bytes_allocated for u in usages), frees=sum(u.frees for u in usages),
        capture_allocs=sum(u.capture_allocs for u in usages), capture_bytes=sum(u.capture_bytes for u in usages),
        grew=any(u.grew for u in usages))


def _evidence(u: Usage) -> tuple[tuple[str, int | float | str], ...]:
    out: list[tuple[str, int | float | str]] = [
        ("live_bytes", u.live_bytes), ("peak_bytes", u.peak_bytes), ("allocs", u.allocs),
        ("bytes_allocated", u.bytes_allocated), ("capture_bytes", u.capture_bytes)]
    if u.churn_per_step is not None:
        out.append(("churn_per_step", u.churn_per_step))
    if u.median_lifetime_us is not None:
        out.append(("median_lifetime_us", u.median_lifetime_us))
    return tuple(out)


def with_findings(result: Join, findings: Iterable[Finding], sites: Sequence[Site]) -> Join:
    out: list[RuntimeFinding] = []
    for f in findings:
        if f.suppressed:
            continue
        j = _usage_at(result, f.path, f.line)
        status, message, evidence = _confirm(f, j, result)
        if result.source != "snapshot" and status != "confirmed":
            continue  # a native record speaks only for what it saw
        u = j.usage if j else Usage()
        out.append(RuntimeFinding(f.rule, f.severity.value, f.path, f.line, f.scope, message, status,
                                  evidence or _evidence(u)))
    for j in result.sites:
        s, u = j.site, j.usage
        if j.verdict == "disagrees":
            out.append(RuntimeFinding("tier-lifetime-mismatch", "warning", s.path, s.span.line, s.scope,
                                      f"{s.api}: {j.note}; the census says {s.tier.value} "
                                      f"({TIER_NAMES[s.tier]}): {s.tier_reason or 'see the census'}",
                                      "runtime", _evidence(u)))
        if u.churn_per_step is not None and u.churn_per_step >= 1.0 and u.capture_allocs < u.allocs:
            out.append(RuntimeFinding("per-step-churn", "warning", s.path, s.span.line, s.scope,
                                      f"{s.api} allocated {u.churn_per_step} times per step over {result.steps} "
                                      f"steps (median lifetime {_us(u.median_lifetime_us)}): allocator traffic "
                                      f"on every step; allocate once and reuse", "runtime", _evidence(u)))
    for p in result.implicit:
        u = p.usage
        if u.churn_per_step is not None and u.churn_per_step >= 1.0 and u.capture_allocs < u.allocs:
            out.append(RuntimeFinding("per-step-churn", "warning", p.path, p.line, p.function,
                                      f"an implicit allocation (no census site) {u.churn_per_step} times per step "
                                      f"over {result.steps} steps", "runtime", _evidence(u)))
    out.sort(key=lambda r: r.sort_key)
    return Join(**{**{f: getattr(result, f) for f in result.__dataclass_fields__}, "findings": tuple(out)})


def _us(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1000:.1f} ms" if value >= 1000 else f"{value:.0f} us"


def _confirm(f: Finding, j: JoinedSite | None, result: Join
             ) -> tuple[str, str, tuple[tuple[str, int | float | str], ...]]:
    """The runtime's answer to one static finding."""
    u = j.usage if j else Usage()
    if f.rule == "snapshot-before-construction":
        later = [r for r in f.related if "measurement cannot see" in r.note]
        total, names = 0, []
        for r in later:
            for js in result.sites:
                s = js.site
                if s.via is not None and s.via.path == r.path and s.via.line == r.line or \
                        s.path == r.path and s.span.line == r.line:
                    total += js.usage.live_bytes
                    if js.usage.live_bytes:
                        names.append(f"{s.path}:{s.span.line}")
        if total:
            return ("confirmed", f"{f.message} — at runtime, {total} bytes allocated after the measurement "
                                 f"are live at the snapshot ({', '.join(sorted(set(names))[:4])})",
                    (("bytes_unseen_by_measurement", total),))
        return ("not-reached", f"{f.message} — the buffers built after it were not seen at runtime", ())
    if f.rule == "throwaway-graph-pool":
        scope = _last(f.scope)
        hit = [p for p in result.pools if any(fn.startswith(f"{f.path}:") and fn.endswith(f":{scope}")
                                              for fn in p.functions)]
        if hit:
            captured = sum(p.capture_bytes for p in hit)
            kept = sum(p.reserved for p in hit)
            live = sum(p.live for p in hit)
            return ("confirmed", f"{f.message} — at runtime, {captured} bytes were captured into pool "
                                 f"{', '.join(str(p.pool) for p in hit)}; at the snapshot it still reserves "
                                 f"{kept} bytes ({live} live)",
                    (("capture_bytes", captured), ("pool_reserved", kept), ("pool_live", live)))
        return ("not-observed", f"{f.message} — no capture into a pool from {f.scope} was seen", ())
    if j is not None and j.verdict == "not-visible":
        return ("not-visible", f"{f.message} — {j.note}", ())
    if j is None:
        # a finding on a call line: the allocation it names, in a related
        # location or its note ("cudaMalloc at pkg/pool.py:34")
        places = [(r.path, r.line) for r in f.related]
        places += [(m.group(1), int(m.group(2))) for r in f.related for m in _PLACE.finditer(r.note)]
        for path, line in places:
            k = _usage_at(result, path, line)
            if k is not None and k.verdict == "not-visible":
                return ("not-visible", f"{f.message} — {k.note}", ())
            if k is not None and k.usage.reached:
                j, u = k, k.usage
                break
    if j is None or not u.reached:
        return ("not-reached", f"{f.message} — not reached at runtime", ())
    if f.rule == "alloc-in-capture":
        if u.capture_allocs:
            return ("confirmed", f"{f.message} — at runtime, {u.capture_allocs} allocations "
                                 f"({u.capture_bytes} bytes) ran under capture", ())
        return ("not-observed", f"{f.message} — reached, but never under capture in this run", ())
    if f.rule == "grow-on-demand":
        if u.allocs > 1 and u.grew:
            return ("confirmed", f"{f.message} — at runtime it grew: {u.allocs} allocations, "
                                 f"{u.live_bytes} bytes still live", ())
        return ("not-observed", f"{f.message} — reached, did not grow in this run", ())
    if f.rule in ("per-call-alloc", "alloc-bypasses-plan"):
        return ("confirmed", f"{f.message} — at runtime, {u.allocs} allocations", ())
    return ("confirmed" if u.reached else "not-reached", f"{f.message} — reached at runtime", ())
