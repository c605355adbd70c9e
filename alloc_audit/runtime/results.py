"""Runtime, join: what a join produces (per-site usage, implicit points,
buckets, pools, findings confirmed or not; one frozen :class:`Join`), read
by the renderers in ``report/join_*.py``. Computed by :mod:`.join`; the
verdicts by :mod:`.verdicts`."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import Site
from .match import NO_FRAMES, OUTSIDE

BUCKETS = {
    NO_FRAMES: "no frames (allocated before recording began, or recorded without stacks)",
    OUTSIDE: "frames outside the scanned tree (framework or library code only)",
    "history-truncated": "freed allocations whose allocation fell off the trace (max_entries)",
    "cache-slack": "reserved by the allocator but not allocated (cache slack)",
    "pytorch-allocator": "native allocations made by PyTorch's caching allocator (they are in the snapshot)",
}
TIMELINE_POINTS = 240
LOAD_PHASES = frozenset({"", "init", "load"})


@dataclass(frozen=True, slots=True)
class Usage:
    """What the run did at one site, implicit point or bucket."""

    live_bytes: int = 0
    live_blocks: int = 0
    live_in_graph_pools: int = 0
    peak_bytes: int = 0
    allocs: int = 0
    bytes_allocated: int = 0
    frees: int = 0
    median_lifetime_us: float | None = None
    churn_per_step: float | None = None
    capture_allocs: int = 0
    capture_bytes: int = 0
    streams: tuple[int, ...] = ()
    phases: tuple[str, ...] = ()
    grew: bool = False  # a later allocation was larger than the one before it
    late_allocs: int = 0  # allocations outside the init/load phases

    @property
    def reached(self) -> bool:
        return self.allocs > 0 or self.live_bytes > 0


@dataclass(frozen=True, slots=True)
class JoinedSite:
    site: Site
    how: str  # exact, function, exact+function; "" when not reached
    usage: Usage
    observed: str  # alive at end, per step, freed, not reached, not visible
    verdict: str  # agrees, disagrees, not-reached, not-visible, no-tier
    note: str = ""


@dataclass(frozen=True, slots=True)
class ImplicitPoint:
    path: str
    line: int
    function: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class Bucket:
    name: str
    bytes: int
    note: str


@dataclass(frozen=True, slots=True)
class RuntimeFinding:
    """A finding with a ``runtime`` evidence section. ``status`` is
    confirmed, not-observed, not-reached or runtime (found by the run alone)."""

    rule: str
    severity: str
    path: str
    line: int
    scope: str
    message: str
    status: str
    runtime: tuple[tuple[str, int | float | str], ...] = ()

    @property
    def sort_key(self) -> tuple[str, int, str]:
        return (self.path, self.line, self.rule)


@dataclass(frozen=True, slots=True)
class Pool:
    pool: tuple[int, int]
    reserved: int
    live: int
    capture_bytes: int
    functions: tuple[str, ...]  # project functions on the stacks of its capture allocations


@dataclass(frozen=True, slots=True)
class SnapshotSummary:
    path: str
    stacks: str
    segments: int
    blocks: int
    events: int
    reserved: int
    allocated: int
    truncated: bool
    steps: int
    unknown_actions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Join:
    snapshots: tuple[SnapshotSummary, ...]
    sites: tuple[JoinedSite, ...]
    implicit: tuple[ImplicitPoint, ...]
    buckets: tuple[Bucket, ...]
    findings: tuple[RuntimeFinding, ...]
    pools: tuple[Pool, ...]
    tiers: tuple[tuple[str, int, int], ...]  # (tier, live bytes, peak bytes)
    timeline: tuple[tuple[int, tuple[int, ...]], ...]  # (time_us from start, live bytes per tier in `tiers` order)
    frames_mapped: int
    frames_total: int
    reserved: int
    live: int
    accounted: int  # live bytes attributed to a site (exact or function)
    steps: int
    source: str = "snapshot"  # or "native"

    @property
    def accounted_share(self) -> float:
        return 100.0 * self.accounted / self.live if self.live else 100.0
