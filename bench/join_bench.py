"""Time ``alloc-audit join`` on a synthesised snapshot of N trace events
(default 100,000) against the demo tree. The snapshot is built here (no GPU):
a few hundred distinct stacks (each entry its own list of shared frame dicts, as
torch writes them) over the demo's real site lines, op lines and
framework frames, allocations freed in a ring, segments opened and freed,
step markers; 2,000 blocks live at the end. Prints the wall-clock time of
each phase and of the whole command (the goal: < 5 s on 2 CPUs).

    python bench/join_bench.py [--events 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import os
import pickle
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINES = [("examples/minigen/kv_cache.py", 16, "__init__"), ("examples/minigen/model_runner.py", 54, "_make_buffer"),
         ("examples/minigen/model_runner.py", 68, "_dummy_run"), ("examples/minigen/model_runner.py", 72, "forward"),
         ("examples/minigen/model_runner.py", 73, "forward"), ("examples/minigen/model_runner.py", 103,
                                                               "execute_model"),
         ("examples/minigen/scratch.py", 41, "overflow"), ("examples/minigen/ops/attention.py", 13,
                                                           "sparse_attention")]
OUTER = [("examples/minigen/model_runner.py", 40, "__init__"), ("examples/minigen/worker.py", 28, "init_device"),
         ("examples/minigen/demo.py", 68, "run"), ("examples/minigen/model_runner.py", 69, "_dummy_run")]


def synthesise(n_events: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    stacks = []
    for k in range(400):
        inner = [{"filename": f"/opt/torch/lib/python3.12/site-packages/torch/nn/mod{k % 37}.py", "line": 100 + k,
                  "name": f"op{k}"}] if k % 3 else []
        path, line, name = LINES[k % len(LINES)]
        frames = inner + [{"filename": f"/app/{path}", "line": line, "name": name}]
        frames += [{"filename": f"/app/{p}", "line": ln, "name": nm} for p, ln, nm in rng.sample(OUTER, 2)]
        frames += [{"filename": "<frozen runpy>", "line": 88, "name": "_run_code"}]
        stacks.append(frames)
    trace, live, t = [], [], 0
    base, seg_size = 1 << 40, 1 << 26
    segments = [(base + i * seg_size) for i in range(64)]
    for addr in segments:
        trace.append({"action": "segment_alloc", "addr": addr, "size": seg_size, "stream": 0, "time_us": t,
                      "frames": stacks[0]})
    next_addr = {s: s for s in segments}
    while len(trace) < n_events:
        t += rng.randint(1, 50)
        step = t // 5000
        if live and (len(live) > 4000 or rng.random() < 0.45):
            addr, size = live.pop(rng.randrange(len(live)))
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
                              "frames": list(stacks[rng.randrange(len(stacks))]),
                              "user_metadata": f"phase=serve;step={step}"})
            continue
        seg = segments[rng.randrange(len(segments))]
        size = 512 * rng.randint(1, 64)
        addr = next_addr[seg]
        next_addr[seg] = addr + size if addr + 2 * size < seg + seg_size else seg
        live.append((addr, size))
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t,
                      "frames": list(stacks[rng.randrange(len(stacks))]), "user_metadata": f"phase=serve;step={step}"})
    keep = live[:2000]
    blocks_by_seg: dict[int, list] = {s: [] for s in segments}
    for addr, size in keep:
        seg = max(s for s in segments if s <= addr)
        blocks_by_seg[seg].append({"address": addr, "size": size, "requested_size": size,
                                   "state": "active_allocated", "frames": stacks[addr % len(stacks)]})
    segs = [{"device": 0, "address": s, "total_size": seg_size, "allocated_size": sum(b["size"] for b in bl),
             "stream": 0, "segment_pool_id": (0, 0), "blocks": bl} for s, bl in blocks_by_seg.items()]
    return {"segments": segs, "device_traces": [trace[:n_events]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.pickle.gz"
        started = time.perf_counter()
        path.write_bytes(gzip.compress(pickle.dumps(synthesise(args.events)), compresslevel=6))
        print(f"synthesised {args.events} events in {time.perf_counter() - started:.2f} s: "
              f"{path.stat().st_size / 1e6:.1f} MB gzipped")

        from alloc_audit.runtime.snapshot import read_snapshot

        started = time.perf_counter()
        snap = read_snapshot(path)
        print(f"read + normalise: {time.perf_counter() - started:.2f} s "
              f"({len(snap.events)} events, {len(snap.stacks)} distinct stacks, {len(snap.blocks)} blocks)")
        # warm the scan cache once, then time the whole command as a user runs it
        cmd = [sys.executable, "-m", "alloc_audit", "join", str(path), "examples", "-f", "json", "-o",
               str(Path(tmp) / "out.json")]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
        times, cpu = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
            times.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        print(f"alloc-audit join (whole command, warm scan cache), median of {args.repeat}: "
              f"{statistics.median(times):.2f} s wall, {statistics.median(cpu):.2f} s CPU "
              f"(wall runs: {', '.join(f'{t:.2f}' for t in times)}; goal < 5 s; "
              f"load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
