#!/usr/bin/env python3
"""A CI-like run with a restored cache, as the Action does it.

    python bench/ci_cache.py TREE [TREE ...] [--runs 3] [--tool NAME=PYTHONPATH ...]

A first run in a checkout of TREE fills a cache directory. Then, each round:
the checkout is deleted and copied afresh to the same path (every mtime and
inode new, as on a CI runner), 20 files are changed (a line appended to 10
files alloc-audit parses and 10 it skips), the cache directory is restored
(copied from the first run's), and `scan` runs; next to it, in the same
round, a scan without a cache. Wall and CPU (user + system of the process tree), medians.
--tool runs the same rounds for another checkout of alloc-audit (its package
directory on PYTHONPATH), e.g. the commit before a change.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (bench/bench.py)


def fresh_checkout(trees: list[Path], dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    made = bench.copy_tree(trees, dest.parent / "stage")
    made.rename(dest)
    shutil.rmtree(dest.parent / "stage")
    return dest


def change(root: Path, parsed: list[str], skipped: list[str]) -> list[str]:
    files = parsed[:: max(1, len(parsed) // 10)][:10] + skipped[:: max(1, len(skipped) // 10)][:10]
    for rel in files:
        with open(root / rel, "a", encoding="utf-8") as fh:
            fh.write("\n# changed in this pull request\n" if rel.endswith(".py") else "\n// changed\n")
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", type=Path, nargs="+")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tool", action="append", default=[], help="NAME=PYTHONPATH of another alloc-audit")
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    tools = {"this checkout": None, **{k: v for k, v in (t.split("=", 1) for t in args.tool)}}
    t = bench.Timings()
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="alloc-audit-ci-") as tmp:
        tmpdir = Path(tmp)
        checkout = tmpdir / "runner" / "work" / "repo"
        root = fresh_checkout(trees, checkout)
        all_files = [str(p.relative_to(root)) for p in bench.floor.source_files(root)]
        parsed = sorted(str(p.relative_to(root)) for p in bench.parsed_files(root, tmpdir / "probe"))
        skipped = sorted(set(all_files) - set(parsed))
        saved: dict[str, Path] = {}
        for name, path in tools.items():  # the run that saved the cache (on the base branch)
            env = {"PYTHONPATH": path} if path else None
            saved[name] = tmpdir / f"saved-{len(saved)}"
            bench.sh([*bench.CLI, "scan", ".", "--format", "json", "--cache-dir", str(saved[name]),
                      "-o", str(tmpdir / "out.json")], root, env)
        for i in range(args.runs):
            print(f"round {i + 1}, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
            for name, path in tools.items():
                env = {"PYTHONPATH": path} if path else None
                root = fresh_checkout(trees, checkout)
                change(root, parsed, skipped)
                restored = tmpdir / "restored"
                if restored.exists():
                    shutil.rmtree(restored)
                shutil.copytree(saved[name], restored)
                scan = [*bench.CLI, "scan", ".", "--format", "json", "-o", str(tmpdir / "out.json")]
                t.sh(f"{name}: scan, restored cache, 20 files changed", [*scan, "--cache-dir", str(restored)],
                     root, env)
                t.sh(f"{name}: scan, no cache", [*scan, "--no-cache"], root, env)
        load.append(os.getloadavg())
        facts = bench.tree_facts(checkout)
    print(f"{' + '.join(tr.name for tr in trees)}: {len(all_files)} files ({len(parsed)} parsed cold); load "
          f"average {' '.join(f'{x:.2f}' for x in load[0])} at the start, {' '.join(f'{x:.2f}' for x in load[-1])} "
          f"at the end; medians of {args.runs}. {facts.get('lines', 0):,} lines.\n")
    print("| what | wall s | CPU s | runs (wall) |\n|---|--:|--:|---|")
    for what in t.wall:
        print(f"| {what} | {t.med(what):.2f} | {t.cpu_med(what):.2f} | {' '.join(f'{x:.2f}' for x in t.wall[what])} |")


if __name__ == "__main__":
    main()
