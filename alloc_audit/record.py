"""Record a program's GPU memory history for ``alloc-audit join``.

    python -m alloc_audit.record [--out DIR] [--max-entries N] [--stacks python|all] -- script.py ARGS...
    python -m alloc_audit.record -- -m package.module ARGS...
    alloc-audit record -- python script.py ARGS...

The program runs in this process (``runpy``), between
``torch.cuda.memory._record_memory_history(stacks=..., max_entries=...)``
and ``torch.cuda.memory._dump_snapshot``; the snapshot is written gzipped,
one file per rank (``RANK`` or ``LOCAL_RANK`` from the environment), once
the program has returned but before its module globals are dropped, so what
the program keeps at module level is still live in the snapshot. A program
that exits with ``sys.exit`` is dumped too.

Phases: a program may call :func:`mark` (``mark("phase=load")``,
``mark("phase=serve;step=3")``) to tag the allocations that follow through
the allocator's user metadata (torch >= 2.9; a no-op before). ``join`` reads
``phase`` and ``step`` from those tags: steps give churn per step, and
``phase=capture`` marks capture.

torch is needed here only: it is the optional extra ``alloc-audit[record]``,
and nothing else in alloc-audit imports it.
"""

from __future__ import annotations

import argparse
import gzip
import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def mark(text: str) -> None:
    """Tag the allocations that follow (user metadata); a no-op where the
    torch version has no user metadata."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    setter = getattr(torch.cuda.memory, "_set_memory_metadata", None)
    if setter is not None:
        setter(text)


def snapshot_name(out: Path) -> Path:
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
    return out / f"snapshot-rank{rank}.pickle.gz"


def dump(path: Path) -> Path:
    """Dump the allocator's snapshot, gzipped (torch writes a plain pickle)."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(raw))
        with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
    return path


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        ours, program = argv[:cut], argv[cut + 1:]
    else:
        ours, program = [], argv
    parser = argparse.ArgumentParser(prog="python -m alloc_audit.record", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the snapshot(s)")
    parser.add_argument("--max-entries", type=int, default=200_000, help="trace entries kept (oldest dropped)")
    parser.add_argument("--stacks", choices=("python", "all"), default="python")
    args = parser.parse_args(ours)
    if program and Path(program[0]).name.startswith("python"):
        program = program[1:]  # `record -- python script.py`: the program runs in this interpreter
    if not program:
        parser.error("name the program after --: a script path or -m module")
    return args, program


def main(argv: list[str] | None = None) -> int:
    args, program = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("alloc-audit record: error: recording needs torch (pip install 'alloc-audit[record]'); "
              "join does not", file=sys.stderr)
        return 2

    torch.cuda.memory._record_memory_history(stacks=args.stacks, max_entries=args.max_entries)
    code: Any = 0
    saved_argv = sys.argv
    kept: dict[str, Any] = {}
    try:
        if program[0] == "-m":
            sys.argv = program[1:]
            kept = runpy.run_module(program[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = program
            sys.path.insert(0, str(Path(program[0]).resolve().parent))
            kept = runpy.run_path(program[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = saved_argv
        path = dump(snapshot_name(args.out))
        torch.cuda.memory._record_memory_history(enabled=None)
        print(f"alloc-audit record: wrote {path}", file=sys.stderr)
    del kept
    return code if isinstance(code, int) else (0 if code is None else 1)


if __name__ == "__main__":
    sys.exit(main())
