"""Runtime, read: native allocation records -> the :class:`Snapshot` shape.

Device memory taken outside PyTorch's caching allocator (``cudaMalloc``
through ctypes or a C++ extension, IPC slabs, NCCL buffers) is not in a
PyTorch snapshot. Two records of it are read here, both plain text (nothing
is unpickled):

- the JSON lines of alloc-audit's recorder shim
  (``tools/native/cudart_recorder.c``): one object per call, ``action``
  ``alloc`` or ``free``, ``api``, ``addr``, ``size``, ``rc``, the calling
  thread's Python ``frames`` and its ``native`` frames (symbol names);
- a ``compute-sanitizer --tool memcheck --leak-check full`` report: each
  ``Leaked N bytes at 0x...`` with its host backtrace, C++ frames
  (demangled) and Python frames (``__init__ in pool.py:34``, a bare file
  name).

Allocations whose native stack passes through PyTorch's caching allocator
are already in the snapshot; they are counted in a bucket of their own and
left out of the join. What remains is attributed like a snapshot's blocks:
by the innermost frame in the tree, C++ frames by function name.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from .snapshot import DEFAULT_POOL, Block, Event, Frame, Snapshot
from .unpickle import MAX_BYTES, SnapshotError

TORCH_ALLOCATOR = ("CUDACachingAllocator", "libc10_cuda.so")
_LEAK = re.compile(r"Leaked ([\d,]+) bytes at (0x[0-9a-fA-F]+)")
_PY_FRAME = re.compile(r"Host Frame: (\S+) in (\S+?):(\d+)\s*$")
_C_FRAME = re.compile(r"Host Frame: ?(.*?) \[0x[0-9a-fA-F]+\] in (\S+)\s*$")


def is_native_record(head: bytes) -> bool:
    text = head.lstrip()
    return text.startswith(b"{") or b"COMPUTE-SANITIZER" in head or b"Leaked " in head


def read_text(path: Path, limit: int = MAX_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                fh.seek(0)
                with gzip.GzipFile(fileobj=fh) as gz:
                    data = gz.read(limit + 1)
            else:
                fh.seek(0)
                data = fh.read(limit + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise SnapshotError(f"{path}: cannot read: {exc}") from None
    if len(data) > limit:
        raise SnapshotError(f"{path}: larger than {limit} bytes unpacked; not read")
    return data.decode("utf-8", errors="replace")


class _Builder:
    def __init__(self) -> None:
        self.stacks: list[tuple[Frame, ...]] = [()]
        self.index: dict[tuple[Frame, ...], int] = {(): 0}
        self.blocks: list[Block] = []
        self.events: list[Event] = []
        self.torch_bytes = 0

    def stack(self, frames: tuple[Frame, ...]) -> int:
        found = self.index.get(frames)
        if found is None:
            found = self.index[frames] = len(self.stacks)
            self.stacks.append(frames)
        return found

    def snapshot(self, path: Path, kind: str) -> Snapshot:
        return Snapshot(path=str(path), segments=(), blocks=tuple(self.blocks), events=tuple(self.events),
                        stacks=tuple(self.stacks), stack_kind=kind,
                        extra_buckets=(("pytorch-allocator", self.torch_bytes),))


def _through_torch(names: list[str]) -> bool:
    return any(marker in n for n in names for marker in TORCH_ALLOCATOR)


def read_recorder_log(path: Path, text: str) -> Snapshot:
    b = _Builder()
    live: dict[int, tuple[int, int]] = {}  # addr -> (size, stack)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            _recorder_line(b, live, json.loads(line), n)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SnapshotError(f"{path}:{n}: not a recorder line ({type(exc).__name__}: {exc})") from None
    for addr, (size, stack) in sorted(live.items()):
        b.blocks.append(Block(addr, size, size, "active_allocated", stack, DEFAULT_POOL, 0, 0))
    return b.snapshot(path, "python")


def _recorder_line(b: _Builder, live: dict[int, tuple[int, int]], entry: Any, n: int) -> None:
    action, addr, size = entry["action"], int(entry["addr"]), int(entry.get("size", 0))
    if action == "alloc":
        if entry.get("rc", 0) != 0 or not addr:
            return
        natives = [str(f.get("name", "??")) for f in entry.get("native", [])]
        natives += [str(f.get("object", "")) for f in entry.get("native", [])]
        if _through_torch(natives):
            b.torch_bytes += size
            return
        frames = tuple(Frame(str(f["filename"]), int(f["line"]), str(f["name"])) for f in entry.get("frames", []))
        stack = b.stack(frames)
        live[addr] = (size, stack)
        b.events.append(Event("alloc", addr, size, 0, n, stack, 0, phase=str(entry.get("api", ""))))
    elif action == "free" and addr in live:
        size, _ = live.pop(addr)
        b.events.append(Event("free_requested", addr, size, 0, n, 0, 0))


def read_sanitizer_report(path: Path, text: str) -> Snapshot:
    b = _Builder()
    leaks: list[tuple[int, int, list[Frame], list[str]]] = []
    for line in text.splitlines():
        m = _LEAK.search(line)
        if m:
            leaks.append((int(m.group(1).replace(",", "")), int(m.group(2), 16), [], []))
            continue
        if not leaks or "Host Frame" not in line:
            continue
        frames, names = leaks[-1][2], leaks[-1][3]
        p = _PY_FRAME.search(line)
        if p and p.group(2).endswith(".py"):
            frames.append(Frame(p.group(2), int(p.group(3)), p.group(1)))
            continue
        c = _C_FRAME.search(line)
        if c:
            names.append(f"{c.group(1)} {c.group(2)}")
            if c.group(1):
                frames.append(Frame("??", 0, c.group(1)))
    for size, addr, frames, names in leaks:
        if _through_torch(names):
            b.torch_bytes += size
            continue
        b.blocks.append(Block(addr, size, size, "active_allocated", b.stack(tuple(frames)), DEFAULT_POOL, 0, 0))
    return b.snapshot(path, "all")


def read_native(path: Path, limit: int = MAX_BYTES) -> Snapshot:
    text = read_text(path, limit)
    if "COMPUTE-SANITIZER" in text[:4096] or _LEAK.search(text[:65536]):
        return read_sanitizer_report(path, text)
    return read_recorder_log(path, text)
