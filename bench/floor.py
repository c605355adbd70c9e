"""The floor and the simple peers alloc-audit is measured against: reading
every byte, a single-process tree-sitter parse of every file, and a per-line
regex census (with and without a byte pre-filter). Used by bench.py; also
runnable alone: ``python bench/floor.py TREE``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

PY = {".py"}
NATIVE = {".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".hxx", ".inl"}

# the regex census: the same APIs as the semgrep ruleset, one pass per line
LINE = re.compile(
    rb"\btorch\.(?:empty|zeros|ones|full|empty_like|zeros_like|ones_like|full_like|empty_strided)\s*\("
    rb"|\btorch\.tensor\s*\([^)]*device\s*="
    rb"|\.new_(?:empty|zeros|full)\s*\("
    rb"|pin_memory\s*(?:=\s*True|\()"
    rb"|\btorch\.cuda\.(?:graph_pool_handle|mem_get_info)\s*\("
    rb"|\b(?:cudaMalloc|cudaMallocAsync|cudaMallocManaged|cudaMallocHost|cudaHostAlloc|cudaHostRegister"
    rb"|cuMemCreate|cuMemAlloc)\s*\("
    rb"|\b(?:at|torch)::(?:empty|zeros|ones|full|empty_like|zeros_like)\s*\("
)
NEEDLES = (b"torch", b"new_", b"pin_memory", b"cudaMalloc", b"cudaHost", b"cuMem", b"at::")


def source_files(root: Path) -> list[Path]:
    """The tracked source files (git ls-files), as alloc-audit discovers them."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                          capture_output=True, check=True)
    out = []
    for name in proc.stdout.split(b"\0"):
        if not name:
            continue
        path = root / os.fsdecode(name)
        if path.suffix.lower() in PY | NATIVE and path.is_file() and not path.is_symlink():
            out.append(path)
    return sorted(out)


def read_all(root: Path) -> float:
    started = time.perf_counter()
    total = 0
    for f in source_files(root):
        with open(f, "rb") as fh:
            total += len(fh.read())
    return time.perf_counter() - started


def parse_all(root: Path) -> tuple[float, int]:
    """Seconds to parse every file in one process, and how many had errors."""
    import tree_sitter
    import tree_sitter_cuda
    import tree_sitter_python

    python = tree_sitter.Parser(tree_sitter.Language(tree_sitter_python.language()))
    cuda = tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))
    files = source_files(root)
    started = time.perf_counter()
    errors = 0
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        tree = (python if f.suffix == ".py" else cuda).parse(data)
        errors += tree.root_node.has_error
    return time.perf_counter() - started, errors


def parse_files(files: list[Path], procs: int = 1) -> float:
    """Seconds to parse the given files with `procs` processes (files dealt
    largest first to the least loaded process), pool start-up included."""
    started = time.perf_counter()
    if procs <= 1:
        _parse_batch([str(f) for f in files])
        return time.perf_counter() - started
    from concurrent.futures import ProcessPoolExecutor

    batches: list[list[str]] = [[] for _ in range(procs)]
    loads = [0] * procs
    for f in sorted(files, key=lambda f: -f.stat().st_size):
        i = loads.index(min(loads))
        batches[i].append(str(f))
        loads[i] += f.stat().st_size
    started = time.perf_counter()
    with ProcessPoolExecutor(procs) as pool:
        list(pool.map(_parse_batch, batches))
    return time.perf_counter() - started


def _parse_batch(paths: list[str]) -> int:
    import tree_sitter
    import tree_sitter_cuda
    import tree_sitter_python

    python = tree_sitter.Parser(tree_sitter.Language(tree_sitter_python.language()))
    cuda = tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))
    errors = 0
    for name in paths:
        with open(name, "rb") as fh:
            data = fh.read()
        errors += (python if name.endswith(".py") else cuda).parse(data).root_node.has_error
    return errors


def regex_census(root: Path, prefilter: bool) -> tuple[float, int]:
    started = time.perf_counter()
    hits = 0
    for f in source_files(root):
        with open(f, "rb") as fh:
            data = fh.read()
        if prefilter and not any(n in data for n in NEEDLES):
            continue
        for line in data.splitlines():
            if LINE.search(line):
                hits += 1
    return time.perf_counter() - started, hits


if __name__ == "__main__":
    tree = Path(sys.argv[1])
    print(f"read every byte: {read_all(tree):.2f} s")
    seconds, errors = parse_all(tree)
    print(f"tree-sitter parse of every file: {seconds:.2f} s ({errors} files with errors)")
    for pf in (False, True):
        seconds, hits = regex_census(tree, pf)
        print(f"regex census{' + pre-filter' if pf else ''}: {seconds:.2f} s ({hits} hits)")
