"""Runtime, read: a memory snapshot file -> a normalised :class:`Snapshot`.

Input is the plain data :mod:`.unpickle` returns for a
``torch.cuda.memory._dump_snapshot`` pickle; output frozen records that no
longer depend on the torch version that wrote them:

- stacks: ``frames`` (torch >= 2.1) or the older ``history`` list of
  ``{"addr", "real_size", "frames"}`` per block; ``stacks="all"`` puts C++
  frames (``??`` files, line 0) before the Python ones, and they are kept,
  flagged ``native``;
- block states ``active_allocated``, ``active_pending_free``,
  ``active_awaiting_free`` (live) and ``inactive`` (cached);
- ``device_traces`` actions ``alloc``, ``free_requested``,
  ``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``,
  ``segment_unmap``, ``snapshot`` and ``oom`` (unknown actions are counted,
  not fatal), with ``user_metadata`` tags (``phase=serve;step=3``) and
  ``compile_context``;
- ``segment_pool_id`` (CUDA-graph private pools; ``(0, 0)`` is the default
  pool).

Identical stacks are stored once (``Snapshot.stacks``) and referred to by
index: a long trace repeats a few hundred stacks many thousand times.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from .unpickle import MAX_BYTES, SnapshotError, load_plain

LIVE_STATES = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free"})
KNOWN_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                           "segment_map", "segment_unmap", "snapshot", "oom", "free"})
DEFAULT_POOL = (0, 0)
NATIVE_SUFFIXES = (".cpp", ".cc", ".cxx", ".c", ".cu", ".cuh", ".h", ".hpp", ".hh", ".so")


@dataclass(frozen=True, slots=True)
class Frame:
    filename: str
    line: int
    name: str

    @property
    def native(self) -> bool:
        """A C++ frame (``stacks="all"``): no usable file or line."""
        return self.line == 0 or self.filename in ("??", "") or self.filename.endswith(NATIVE_SUFFIXES)


@dataclass(frozen=True, slots=True)
class Block:
    """A block of a segment at the snapshot."""

    addr: int
    size: int
    requested: int
    state: str
    stack: int  # index into Snapshot.stacks; 0 is the empty stack
    pool: tuple[int, int]
    stream: int
    device: int

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


@dataclass(frozen=True, slots=True)
class Segment:
    addr: int
    total: int
    allocated: int
    pool: tuple[int, int]
    stream: int
    device: int
    kind: str  # "small", "large", or "" when not recorded


class Event(NamedTuple):
    """One trace entry, in the order of the trace (time order). A named
    tuple, not a dataclass: a long trace makes a hundred thousand of them."""

    action: str
    addr: int
    size: int
    stream: int
    time_us: int
    stack: int
    device: int
    phase: str = ""
    step: int | None = None
    compile_context: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    path: str
    segments: tuple[Segment, ...]
    blocks: tuple[Block, ...]
    events: tuple[Event, ...]
    stacks: tuple[tuple[Frame, ...], ...]  # stacks[0] == ()
    stack_kind: str  # "python", "all" (C++ frames too) or "none"
    unknown_actions: tuple[tuple[str, int], ...] = ()
    has_metadata: bool = False
    extra_buckets: tuple[tuple[str, int], ...] = ()  # native records: bytes left out, by reason

    @property
    def reserved(self) -> int:
        return sum(s.total for s in self.segments)

    @property
    def allocated(self) -> int:
        return sum(b.size for b in self.blocks if b.live)


_FRAME_KEY = itemgetter("filename", "line", "name")


class _Stacks:
    """Interns stacks: the same list of frames gets the same index."""

    def __init__(self) -> None:
        self.index: dict[tuple[tuple[str, int, str], ...], int] = {(): 0}
        self.stacks: list[tuple[Frame, ...]] = [()]
        self.frames: dict[tuple[str, int, str], Frame] = {}
        self.native_seen = False
        self.by_ids: dict[tuple[int, ...], int] = {}

    def add(self, raw: Any, where: str, k: int | None = None) -> int:
        """The index of this list of frames. The pickle shares frame dicts
        (a snapshot has a few hundred distinct frames in 300k references),
        and the data outlives this pass, so a tuple of the dicts' ids finds
        a known stack without reading a single frame."""
        if not raw:
            return 0
        ids = tuple(map(id, raw)) if type(raw) is list else ()
        found = self.by_ids.get(ids)
        if found is not None:
            return found
        if k is not None:
            where = f"{where}[{k}]"  # only built here: most stacks are known by their ids
        if type(raw) is not list:
            raise SnapshotError(f"{where}: frames is a {type(raw).__name__}, not a list")
        found = self.by_ids[ids] = self._add(raw, where)
        return found

    def _add(self, raw: list[Any], where: str) -> int:
        try:
            key = tuple(map(_FRAME_KEY, raw))
        except (TypeError, KeyError) as exc:
            raise SnapshotError(f"{where}: a frame lacks filename, line or name ({exc})") from None
        found = self.index.get(key)
        if found is not None:
            return found
        frames = []
        for k in key:
            frame = self.frames.get(k)
            if frame is None:
                if not (isinstance(k[0], str) and isinstance(k[1], int) and isinstance(k[2], str)):
                    raise SnapshotError(f"{where}: a frame's filename, line or name has the wrong type")
                frame = self.frames[k] = Frame(k[0], k[1], k[2])
                self.native_seen = self.native_seen or frame.native
            frames.append(frame)
        self.index[key] = len(self.stacks)
        self.stacks.append(tuple(frames))
        return len(self.stacks) - 1


def parse_metadata(text: str) -> tuple[str, int | None]:
    """``phase=serve;step=3`` -> ("serve", 3). Other tags are ignored; a
    bare word is a phase."""
    phase, step = "", None
    for part in text.replace(",", ";").split(";"):
        key, sep, value = part.strip().partition("=")
        if not sep:
            if key:
                phase = key
        elif key == "phase":
            phase = value.strip()
        elif key == "step":
            try:
                step = int(value)
            except ValueError:
                pass
    return phase, step


def _pool(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (value[0], value[1])
    return DEFAULT_POOL


def _int(d: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = d.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        if value is None and default is not None:
            return default
        raise SnapshotError(f"{where}: {key!r} is missing or not an integer")
    return value


def normalise(data: Any, path: str) -> Snapshot:
    """Plain snapshot data -> :class:`Snapshot`, or :class:`SnapshotError`."""
    if isinstance(data, list):  # the oldest format: a bare list of segments
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:
        raise SnapshotError(f"{path}: not a memory snapshot (no 'segments'; was it written by "
                            f"torch.cuda.memory._dump_snapshot?)")
    raw_segments = data["segments"]
    raw_traces = data.get("device_traces") or []
    if not isinstance(raw_segments, list) or not isinstance(raw_traces, list):
        raise SnapshotError(f"{path}: 'segments' and 'device_traces' must be lists")
    stacks = _Stacks()
    segments: list[Segment] = []
    blocks: list[Block] = []
    for i, seg in enumerate(raw_segments):
        where = f"{path}: segment {i}"
        if not isinstance(seg, dict):
            raise SnapshotError(f"{where}: not a mapping")
        addr = _int(seg, "address", where)
        device = _int(seg, "device", where, 0)
        stream = _int(seg, "stream", where, 0)
        pool = _pool(seg.get("segment_pool_id"))
        raw_blocks = seg.get("blocks") or []
        if not isinstance(raw_blocks, list):
            raise SnapshotError(f"{where}: 'blocks' is not a list")
        # older snapshots keep the stack in a per-block "history" list
        offset = addr
        allocated = 0
        for j, blk in enumerate(raw_blocks):
            bwhere = f"{where} block {j}"
            if not isinstance(blk, dict):
                raise SnapshotError(f"{bwhere}: not a mapping")
            size = _int(blk, "size", bwhere)
            state = blk.get("state")
            if not isinstance(state, str):
                raise SnapshotError(f"{bwhere}: 'state' is missing")
            frames = blk.get("frames")
            if frames is None and isinstance(blk.get("history"), list) and blk["history"]:
                last = blk["history"][-1]
                frames = last.get("frames") if isinstance(last, dict) else None
            block = Block(
                addr=_int(blk, "address", bwhere, offset), size=size,
                requested=_int(blk, "requested_size", bwhere, size), state=state,
                stack=stacks.add(frames, bwhere), pool=pool, stream=stream, device=device,
            )
            offset = block.addr + size
            if block.live:
                allocated += size
            blocks.append(block)
        total = _int(seg, "total_size", where)
        segments.append(Segment(addr=addr, total=total, allocated=_int(seg, "allocated_size", where, allocated),
                                pool=pool, stream=stream, device=device,
                                kind=str(seg.get("segment_type", ""))))
    events: list[Event] = []
    unknown: dict[str, int] = {}
    has_metadata = False
    tags: dict[str, tuple[str, int | None]] = {}
    for device, trace in enumerate(raw_traces):
        if not isinstance(trace, list):
            raise SnapshotError(f"{path}: device_traces[{device}] is not a list")
        prefix = f"{path}: device_traces[{device}]"
        add_stack, append, get_tag = stacks.add, events.append, tags.get
        for k, entry in enumerate(trace):
            # the per-entry checks stay cheap: a long trace has 100k entries;
            # the error message is only built when something is wrong
            if type(entry) is not dict:
                raise SnapshotError(f"{prefix}[{k}]: not a mapping")
            action = entry.get("action")
            if action not in KNOWN_ACTIONS:
                if not isinstance(action, str):
                    raise SnapshotError(f"{prefix}[{k}]: 'action' is missing")
                unknown[action] = unknown.get(action, 0) + 1
                continue
            meta = entry.get("user_metadata")
            if meta:
                tag = get_tag(meta) if type(meta) is str else ("", None)
                if tag is None:
                    tag = tags[meta] = parse_metadata(meta)
                phase, step = tag
                has_metadata = True
            else:
                phase, step = "", None
            context = entry.get("compile_context")
            addr, size, stream, time_us = (entry.get("addr", 0), entry.get("size", 0), entry.get("stream", 0),
                                           entry.get("time_us", k))
            if not (type(addr) is int and type(size) is int and type(stream) is int and type(time_us) is int):
                where = f"{prefix}[{k}]"
                addr, size = _int(entry, "addr", where, 0), _int(entry, "size", where, 0)
                stream, time_us = _int(entry, "stream", where, 0), _int(entry, "time_us", where, k)
            frames = entry.get("frames")
            append(Event("free_completed" if action == "free" else action, addr, size, stream, time_us,
                         add_stack(frames, prefix, k) if frames else 0, device, phase, step,
                         "" if context is None or context == "N/A" or type(context) is not str else context))
    kind = "none" if len(stacks.stacks) == 1 else ("all" if stacks.native_seen else "python")
    return Snapshot(path=path, segments=tuple(segments), blocks=tuple(blocks), events=tuple(events),
                    stacks=tuple(stacks.stacks), stack_kind=kind, unknown_actions=tuple(sorted(unknown.items())),
                    has_metadata=has_metadata)


def read_snapshot(path: Path, limit: int = MAX_BYTES) -> Snapshot:
    """Read and normalise one snapshot file (gzipped or not), safely."""
    return normalise(load_plain(path, limit), str(path))
