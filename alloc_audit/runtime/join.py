"""Runtime, join: snapshots + census -> per-site runtime usage and verdicts.

Input: normalised snapshots (:mod:`.snapshot`, or native records read by
:mod:`.native` into the same shape), the census's sites, findings and file
facts; output one frozen :class:`Join`. Pure.

Two passes. The blocks live at the snapshot give *live bytes*, attributed
through their stacks (:mod:`.match`); bytes no site accounts for go to
implicit points or named buckets, never dropped, and the footer reconciles
them: reserved = live (sites + implicit + no frames + outside the tree) +
cache slack. The trace, replayed in time order, gives what a snapshot alone
cannot: allocation counts, peaks, lifetimes, churn per step (steps from
``step=N`` user metadata), streams, and bytes allocated while a capture was
under way (the allocation landed in a segment of a CUDA-graph private pool —
segment events are replayed in order, because a graph pool can reuse the
address of a freed warm-up segment — or a frame lies inside a static capture
region). Then each site's observed lifetime is compared with its tier, and
the static findings are confirmed, or not, by what the run did.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from ..model import Finding, Site, SiteKind, Tier
from .match import EXACT, FUNCTION, IMPLICIT, NO_FRAMES, OUTSIDE, Attribution, Matcher
from .results import (
    BUCKETS,
    LOAD_PHASES,
    TIMELINE_POINTS,
    Bucket,
    ImplicitPoint,
    Join,
    JoinedSite,
    Pool,
    SnapshotSummary,
    Usage,
)
from .snapshot import DEFAULT_POOL, Snapshot
from .verdicts import verdict, with_findings

# ---------------------------------------------------------------- accumulation


@dataclass
class _Acc:
    live_bytes: int = 0
    live_blocks: int = 0
    live_pool: int = 0
    current: int = 0
    peak: int = 0
    allocs: int = 0
    bytes_allocated: int = 0
    frees: int = 0
    lifetimes: list[int] = field(default_factory=list)
    step_allocs: int = 0
    capture_allocs: int = 0
    capture_bytes: int = 0
    streams: set[int] = field(default_factory=set)
    phases: set[str] = field(default_factory=set)
    last_size: int = 0
    grew: bool = False
    late: int = 0
    how: set[str] = field(default_factory=set)

    def freeze(self, steps: int) -> Usage:
        return Usage(
            live_bytes=self.live_bytes, live_blocks=self.live_blocks, live_in_graph_pools=self.live_pool,
            peak_bytes=max(self.peak, self.live_bytes), allocs=self.allocs, bytes_allocated=self.bytes_allocated,
            frees=self.frees,
            median_lifetime_us=float(statistics.median(self.lifetimes)) if self.lifetimes else None,
            churn_per_step=round(self.step_allocs / steps, 3) if steps else None,
            capture_allocs=self.capture_allocs, capture_bytes=self.capture_bytes,
            streams=tuple(sorted(self.streams)), phases=tuple(sorted(p for p in self.phases if p)),
            grew=self.grew, late_allocs=self.late,
        )


def _key(a: Attribution) -> tuple[str, object]:
    if a.how in (EXACT, FUNCTION):
        return ("site", a.site)
    if a.how == IMPLICIT:
        return ("implicit", (a.path, a.line, a.function))
    return ("bucket", a.how)


class _Segments:
    """Segments open at a point of the replay, by start address, per device."""

    def __init__(self) -> None:
        self.starts: dict[int, list[int]] = {}
        self.info: dict[tuple[int, int], tuple[int, tuple[int, int] | None]] = {}  # -> (size, pool)

    def open(self, device: int, addr: int, size: int, pool: tuple[int, int] | None) -> None:
        starts = self.starts.setdefault(device, [])
        if (device, addr) not in self.info:
            bisect.insort(starts, addr)
        self.info[(device, addr)] = (size, pool)

    def close(self, device: int, addr: int) -> None:
        if self.info.pop((device, addr), None) is not None:
            starts = self.starts[device]
            del starts[bisect.bisect_left(starts, addr)]

    def pool_of(self, device: int, addr: int) -> tuple[int, int] | None:
        starts = self.starts.get(device)
        if not starts:
            return None
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0:
            return None
        size, pool = self.info[(device, starts[i])]
        return pool if addr < starts[i] + size else None


def join(snapshots: Sequence[Snapshot], matcher: Matcher, sites: Sequence[Site],
         findings: Iterable[Finding] = (), source: str = "snapshot") -> Join:
    accs: dict[tuple[str, object], _Acc] = {}

    def acc(key: tuple[str, object]) -> _Acc:
        a = accs.get(key)
        if a is None:
            a = accs[key] = _Acc()
        return a

    tier_of_key: dict[tuple[str, object], str] = {}

    def tier(key: tuple[str, object]) -> str:
        t = tier_of_key.get(key)
        if t is None:
            if key[0] == "site":
                t = sites[cast(int, key[1])].tier.value
            elif key[0] == "implicit":
                t = "implicit"
            else:
                t = "unattributed"
            tier_of_key[key] = t
        return t

    summaries: list[SnapshotSummary] = []
    reserved = live = 0
    pool_reserved: dict[tuple[int, int], int] = {}
    pool_live: dict[tuple[int, int], int] = {}
    pool_capture: dict[tuple[int, int], int] = {}
    pool_functions: dict[tuple[int, int], set[str]] = {}
    truncated_bytes = 0
    total_steps = 0
    timeline_raw: list[tuple[int, str, int]] = []  # (time, tier, delta)
    baseline: dict[str, int] = {}
    stack_scopes: dict[int, frozenset[str]] = {}

    for snap in snapshots:
        attrib = [matcher.attribute(s) for s in snap.stacks]
        # -------- live blocks at the snapshot
        for seg in snap.segments:
            reserved += seg.total
            pool_reserved[seg.pool] = pool_reserved.get(seg.pool, 0) + seg.total
        live_addrs: dict[tuple[int, int], tuple[tuple[str, object], int]] = {}
        for block in snap.blocks:
            if not block.live:
                continue
            a = attrib[block.stack]
            key = _key(a)
            entry = acc(key)
            entry.live_bytes += block.size
            entry.live_blocks += 1
            if a.how in (EXACT, FUNCTION):
                entry.how.add(a.how)
            if block.pool != DEFAULT_POOL:
                entry.live_pool += block.size
                pool_live[block.pool] = pool_live.get(block.pool, 0) + block.size
            live += block.size
            live_addrs[(block.device, block.addr)] = (key, block.size)
        # -------- the trace, in time order
        events = snap.events
        steps = {e.step for e in events if e.step is not None}
        total_steps += len(steps)
        final_pools = {(s.device, s.addr, s.total): s.pool for s in snap.segments}
        open_segments = _Segments()
        allocs: dict[tuple[int, int], tuple[int, int, int]] = {}  # -> (stack, size, time)
        allocated_in_trace: set[tuple[int, int]] = set()
        t0 = events[0].time_us if events else 0
        # per stack, once: where its bytes go (a long trace has few stacks)
        stack_keys = [_key(a) for a in attrib]
        stack_accs = [acc(k) for k in stack_keys]
        stack_tiers = [tier(k) for k in stack_keys]
        stack_how = [a.how if a.how in (EXACT, FUNCTION) else "" for a in attrib]
        stack_capture = [a.capture for a in attrib]
        any_pools = any(seg.pool != DEFAULT_POOL for seg in snap.segments)
        timeline_add = timeline_raw.append
        for e in events:
            action = e.action
            if action == "alloc":
                stack, size = e.stack, e.size
                entry = stack_accs[stack]
                entry.allocs += 1
                entry.bytes_allocated += size
                entry.current += size
                if entry.current > entry.peak:
                    entry.peak = entry.current
                entry.streams.add(e.stream)
                entry.phases.add(e.phase)
                if e.phase not in LOAD_PHASES:
                    entry.late += 1
                if e.step is not None:
                    entry.step_allocs += 1
                if entry.last_size and size > entry.last_size:
                    entry.grew = True
                entry.last_size = size
                if stack_how[stack]:
                    entry.how.add(stack_how[stack])
                pool = open_segments.pool_of(e.device, e.addr) if any_pools else None
                in_pool = pool is not None and pool != DEFAULT_POOL
                if in_pool or stack_capture[stack]:
                    entry.capture_allocs += 1
                    entry.capture_bytes += size
                    if in_pool:
                        assert pool is not None
                        pool_capture[pool] = pool_capture.get(pool, 0) + size
                        scopes = stack_scopes.get(stack)
                        if scopes is None:
                            scopes = stack_scopes[stack] = _scopes_on(snap, stack, matcher)
                        pool_functions.setdefault(pool, set()).update(scopes)
                where = (e.device, e.addr)
                allocs[where] = (stack, size, e.time_us)
                allocated_in_trace.add(where)
                timeline_add((e.time_us - t0, stack_tiers[stack], size))
            elif action == "free_requested" or action == "free_completed":
                where = (e.device, e.addr)
                found = allocs.pop(where, None)
                if found is None:
                    if action == "free_requested" and where not in allocated_in_trace:
                        truncated_bytes += e.size
                    continue
                stack, size, start = found
                entry = stack_accs[stack]
                entry.frees += 1
                entry.current -= size
                entry.lifetimes.append(e.time_us - start)
                timeline_add((e.time_us - t0, stack_tiers[stack], -size))
            elif action in ("segment_alloc", "segment_map"):
                open_segments.open(e.device, e.addr, e.size, final_pools.get((e.device, e.addr, e.size)))
            elif action in ("segment_free", "segment_unmap"):
                open_segments.close(e.device, e.addr)
        # blocks live at the snapshot that the trace never saw allocated
        for where, (key, size) in live_addrs.items():
            if where not in allocated_in_trace:
                baseline[tier(key)] = baseline.get(tier(key), 0) + size
        summaries.append(SnapshotSummary(
            path=snap.path, stacks=snap.stack_kind, segments=len(snap.segments), blocks=len(snap.blocks),
            events=len(events), reserved=sum(s.total for s in snap.segments), allocated=snap.allocated,
            truncated=truncated_bytes > 0, steps=len(steps), unknown_actions=snap.unknown_actions,
        ))

    # ---------------------------------------------------------------- per site
    usage: dict[tuple[str, object], Usage] = {k: v.freeze(total_steps) for k, v in accs.items()
                                              if v.allocs or v.live_bytes}
    reached_via: set[int] = set()
    for key, u in usage.items():
        if key[0] == "site" and u.reached:
            s = sites[cast(int, key[1])]
            if s.via is not None:
                for k, base in enumerate(sites):
                    if base.via is None and base.path == s.via.path and base.span.line == s.via.line:
                        reached_via.add(k)
    joined: list[JoinedSite] = []
    for k, site in enumerate(sites):
        if site.kind is SiteKind.RELEASE:
            continue
        u = usage.get(("site", k), Usage())
        how = "+".join(sorted(accs[("site", k)].how)) if ("site", k) in accs else ""
        joined.append(verdict(site, u, how, matcher, total_steps, k in reached_via or k in matcher.outer_derived,
                               source))
    implicit = sorted(
        (ImplicitPoint(key[1][0], key[1][1], key[1][2], u) for key, u in usage.items()  # type: ignore[index]
         if key[0] == "implicit"),
        key=lambda p: (-p.usage.live_bytes, -p.usage.bytes_allocated, p.path, p.line))
    accounted = sum(u.live_bytes for key, u in usage.items() if key[0] == "site")
    implicit_live = sum(p.usage.live_bytes for p in implicit)
    buckets = [Bucket(name, usage.get(("bucket", name), Usage()).live_bytes, BUCKETS[name])
               for name in (NO_FRAMES, OUTSIDE)]
    buckets.append(Bucket("history-truncated", truncated_bytes, BUCKETS["history-truncated"]))
    if source == "snapshot":
        buckets.append(Bucket("cache-slack", reserved - live, BUCKETS["cache-slack"]))
    extra: dict[str, int] = {}
    for snap in snapshots:
        for name, size in snap.extra_buckets:
            extra[name] = extra.get(name, 0) + size
    buckets += [Bucket(name, size, BUCKETS.get(name, name)) for name, size in sorted(extra.items())]
    assert accounted + implicit_live + buckets[0].bytes + buckets[1].bytes == live
    # ---------------------------------------------------------------- tiers and timeline
    tier_names = [t.value for t in Tier] + ["implicit", "unattributed"]
    tier_live = {t: 0 for t in tier_names}
    tier_peak = {t: 0 for t in tier_names}
    for key, u in usage.items():
        tier_live[tier(key)] += u.live_bytes
    samples = _timeline(timeline_raw, tier_names, baseline, tier_peak)
    for t in tier_names:
        tier_peak[t] = max(tier_peak[t], tier_live[t])
    tiers = tuple((t, tier_live[t], tier_peak[t]) for t in tier_names if tier_live[t] or tier_peak[t])
    shown = [t for t, _, _ in tiers]
    index = [tier_names.index(t) for t in shown]
    timeline = tuple((time, tuple(values[i] for i in index)) for time, values in samples)
    pools = tuple(Pool(p, pool_reserved.get(p, 0), pool_live.get(p, 0), pool_capture.get(p, 0),
                       tuple(sorted(pool_functions.get(p, ()))))
                  for p in sorted(set(pool_reserved) | set(pool_capture)) if p != DEFAULT_POOL)
    frames_total = len(matcher.mapped)
    frames_mapped = sum(1 for v in matcher.mapped.values() if v is not None)
    result = Join(
        snapshots=tuple(summaries), sites=tuple(joined), implicit=tuple(implicit), buckets=tuple(buckets),
        findings=(), pools=pools, tiers=tiers, timeline=timeline, frames_mapped=frames_mapped,
        frames_total=frames_total, reserved=reserved, live=live, accounted=accounted, steps=total_steps,
        source=source,
    )
    return with_findings(result, findings, sites)


def _scopes_on(snap: Snapshot, stack: int, matcher: Matcher) -> frozenset[str]:
    out = set()
    for frame in snap.stacks[stack]:
        if not frame.native:
            path = matcher.map_path(frame.filename)
            if path is not None:
                out.add(f"{path}:{frame.name}")
    return frozenset(out)


def _timeline(raw: list[tuple[int, str, int]], tier_names: list[str], baseline: Mapping[str, int],
              peaks: dict[str, int]) -> list[tuple[int, tuple[int, ...]]]:
    """Live bytes per tier over time, sampled down to about TIMELINE_POINTS
    points (each sample keeps the running maximum of its window, so a peak is
    never sampled away)."""
    if not raw:
        return []
    raw.sort(key=lambda r: r[0])
    pos = {t: i for i, t in enumerate(tier_names)}
    current = [baseline.get(t, 0) for t in tier_names]
    window = max(1, len(raw) // TIMELINE_POINTS)
    out: list[tuple[int, tuple[int, ...]]] = [(0, tuple(current))]
    high = list(current)
    for n, (time, t, delta) in enumerate(raw, 1):
        i = pos[t]
        current[i] += delta
        if current[i] > high[i]:
            high[i] = current[i]
        if current[i] > peaks[t]:
            peaks[t] = current[i]
        if n % window == 0 or n == len(raw):
            out.append((time, tuple(high)))
            high = list(current)
    return out
