#!/usr/bin/env python3
"""Side-by-side benchmark of alloc-audit on a real engine tree.

    python bench/bench.py TREE [TREE ...] [--runs 3] [--out bench/results/NAME.md]
    python bench/bench.py TREE [TREE ...] --cold-only   # one scaling point

Several TREEs are combined (each copied under its own name) into one
project.

Fetches nothing: TREE is a path you provide (a git work tree or a plain
directory). It is copied to a temporary directory first (a local `git clone`
when it is a repository), so the benchmark never writes into it; every
alloc-audit run uses its own cache directory there.

What it measures, each the median of --runs, wall clock and CPU time
(user + system of the whole process tree, from getrusage of the reaped
children), the CLI runs including the interpreter's start-up. Tools are
alternated within each round (alloc-audit cold -j1, cold -jN, ast-grep -j1,
ast-grep -jN, semgrep, the floors) so that load on a shared machine spreads
over all of them rather than over one; the load average is recorded.

- the floor: reading every source byte; a single-process tree-sitter parse of
  every file (the grammars alloc-audit uses); and a 1- and N-process parse of
  the files alloc-audit must read (those it parsed: pre-filtered + on-demand,
  as listed by an instrumented cold run);
- alloc-audit `scan` (census + all rules): cold with --jobs 1 and --jobs N
  (N = CPUs), and warm (nothing changed, cache present);
- `check` on 20 files that hold sites (the pre-commit path), cold and warm,
  and `--version`;
- peak RSS of the cold scan (the parent process and the largest worker);
- the peers: semgrep with bench/semgrep-census.yml (or --semgrep-rules), run
  as installed on PATH or --semgrep; ast-grep (`pip install ast-grep-cli`)
  with the literal census ruleset bench/ast-grep/ on 1 and N threads; a
  per-line regex census, with and without a byte pre-filter;
- byte-identical output: the JSON of jobs=1, jobs=N, cold and warm, compared
  with `stats.seconds` removed.

Prints a Markdown table of medians and ratios against the goals of issue 15,
and writes it to --out when given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import floor  # noqa: E402  (bench/floor.py)

CLI = [sys.executable, "-m", "alloc_audit"]


CPU: list[float] = []  # CPU seconds (user + system, process tree) of the last sh() calls


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def sh(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    # as installed software runs: with byte-compiled modules (some sandboxes
    # set PYTHONDONTWRITEBYTECODE, which adds ~0.05 s of compiling per run)
    full = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cpu = children_cpu()
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**full, **(env or {})})
    seconds = time.perf_counter() - started
    CPU.append(children_cpu() - cpu)
    return seconds, proc


def median_of(runs: int, fn) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(fn() for _ in range(runs))


class Timings:
    """Wall and CPU seconds per measured thing, medians on demand."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def add(self, what: str, wall: float, cpu: float | None) -> None:
        self.wall.setdefault(what, []).append(wall)
        if cpu is not None:
            self.cpu.setdefault(what, []).append(cpu)

    def sh(self, what: str, cmd: list[str], cwd: Path, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
        seconds, proc = sh(cmd, cwd, env)
        self.add(what, seconds, CPU[-1])
        return proc

    def inproc(self, what: str, fn) -> None:  # type: ignore[no-untyped-def]
        """An in-process measurement (the floors): CPU of this process and
        of any pool it starts."""
        before = time.process_time() + children_cpu()
        seconds = fn()
        self.add(what, seconds, time.process_time() + children_cpu() - before)

    def med(self, what: str) -> float | None:
        return statistics.median(self.wall[what]) if self.wall.get(what) else None

    def cpu_med(self, what: str) -> float | None:
        return statistics.median(self.cpu[what]) if self.cpu.get(what) else None


CACHE_NAMES = shutil.ignore_patterns(".alloc-audit-cache", ".git")


def copy_tree(trees: list[Path], dest: Path) -> Path:
    """One tree: copied as is (a local clone of a repository). Several: each
    under its own name in one project. Any alloc-audit cache in a tree is
    left behind, so cold is cold."""
    target = dest / "tree"
    if len(trees) == 1 and (trees[0] / ".git").exists():
        subprocess.run(["git", "clone", "-q", "--local", "--no-hardlinks", str(trees[0]), str(target)], check=True)
        return target
    if len(trees) == 1:
        shutil.copytree(trees[0], target, symlinks=True, ignore=CACHE_NAMES)
    else:
        for tree in trees:
            shutil.copytree(tree, target / tree.name, symlinks=True, ignore=CACHE_NAMES)
    subprocess.run(["git", "init", "-q"], cwd=target, check=True)
    # a standalone project: the tree's own config (if any) is kept; the cache goes to a temp dir
    return target


def tree_facts(root: Path) -> dict[str, int]:
    files = floor.source_files(root)
    sizes = [f.stat().st_size for f in files]
    lines = 0
    for f in files:
        with open(f, "rb") as fh:
            lines += fh.read().count(b"\n")
    return {"files": len(files), "py": sum(1 for f in files if f.suffix == ".py"),
            "native": sum(1 for f in files if f.suffix != ".py"), "bytes": sum(sizes), "lines": lines}


def scan_json(root: Path, cache: Path, jobs: int, extra: list[str] | None = None,
              timings: Timings | None = None, what: str = "") -> tuple[float, dict]:
    seconds, proc = sh([*CLI, "scan", ".", "--format", "json", "--jobs", str(jobs), "--cache-dir", str(cache),
                        *(extra or [])], root)
    if timings is not None:
        timings.add(what, seconds, CPU[-1])
    if proc.returncode != 0:
        raise SystemExit(f"alloc-audit scan failed ({proc.returncode}):\n{proc.stderr}")
    doc = json.loads(proc.stdout)
    doc["stats"].pop("seconds", None)
    return seconds, doc


def rss_of_cold_scan(root: Path, cache: Path, jobs: int) -> tuple[float, float]:
    """Peak RSS (MB) of the parent process and of the largest worker."""
    code = (
        "import resource, sys\n"
        "sys.argv = ['alloc-audit', 'scan', '.', '--jobs', sys.argv[1], '--cache-dir', sys.argv[2], '--format', 'json']\n"
        "from alloc_audit.cli import app\n"
        "try:\n    app(prog_name='alloc-audit')\nexcept SystemExit:\n    pass\n"
        "me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "sys.stderr.write(f'RSS {me} {kids}\\n')\n"
    )
    _, proc = sh([sys.executable, "-c", code, str(jobs), str(cache)], root)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("RSS "))
    me, kids = (int(v) / 1024 for v in line.split()[1:])
    return me, kids


def parsed_files(root: Path, cache: Path) -> list[Path]:
    """The files a cold scan parses (pre-filtered + on-demand): a scan whose
    stage `_stats` is wrapped to list the parsed paths."""
    code = (
        "import sys\n"
        "from alloc_audit.pipeline import run\n"
        "real = run._stats\n"
        "def listing(files, facts, seconds):\n"
        "    sys.stderr.write('PARSED\\0' + '\\0'.join(sorted(facts)) + '\\n')\n"
        "    return real(files, facts, seconds)\n"
        "run._stats = listing\n"
        "sys.argv = ['alloc-audit', 'scan', '.', '--jobs', '1', '--cache-dir', sys.argv[1], '--format', 'json']\n"
        "from alloc_audit.cli import app\n"
        "try:\n    app(prog_name='alloc-audit')\nexcept SystemExit:\n    pass\n"
    )
    _, proc = sh([sys.executable, "-c", code, str(cache)], root)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("PARSED\0"))
    return [root / p for p in line.split("\0")[1:] if p]


def ast_grep_bin() -> str | None:
    for name in ("ast-grep", "sg"):
        found = shutil.which(name)
        if found:
            return found
    return None


def run_ast_grep(root: Path, threads: int, timings: Timings, what: str) -> int | None:
    exe = ast_grep_bin()
    if exe is None:
        return None
    proc = timings.sh(what, [exe, "scan", "-c", str(HERE / "ast-grep" / "sgconfig.yml"), "--json=compact",
                             "--threads", str(threads), "."], root)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"ast-grep failed ({proc.returncode}):\n{proc.stderr[-400:]}")
    return len(json.loads(proc.stdout or "[]"))


def pick_files(doc: dict, n: int = 20) -> list[str]:
    paths = sorted({s["path"] for s in doc["sites"] if s["via"] is None})
    if len(paths) <= n:
        return paths
    step = len(paths) / n
    return [paths[int(i * step)] for i in range(n)]


def semgrep_version(semgrep: str) -> str | None:
    if not shutil.which(semgrep) and not Path(semgrep).exists():
        return None
    quiet = {**os.environ, "SEMGREP_SEND_METRICS": "off", "SEMGREP_ENABLE_VERSION_CHECK": "0"}
    return subprocess.run([semgrep, "--version", "--disable-version-check"], capture_output=True, text=True,
                          env=quiet).stdout.strip()


def semgrep_once(root: Path, rules: Path, semgrep: str, timings: Timings, what: str) -> int:
    seconds, proc = sh([semgrep, "scan", "--config", str(rules), "--json", "--metrics=off",
                        "--disable-version-check", "--no-git-ignore", "-j", str(os.cpu_count() or 1),
                        "--timeout", "0", "--max-target-bytes", "2000000", "."], root,
                       {"SEMGREP_SEND_METRICS": "off", "SEMGREP_ENABLE_VERSION_CHECK": "0"})
    timings.add(what, seconds, CPU[-1])
    if proc.returncode not in (0, 1):
        raise SystemExit(f"semgrep failed: {proc.stderr[-400:]}")
    return len(json.loads(proc.stdout)["results"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", type=Path, nargs="+")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--semgrep", default="semgrep")
    ap.add_argument("--semgrep-rules", type=Path, default=HERE / "semgrep-census.yml")
    ap.add_argument("--cold-only", action="store_true", help="only the cold scan (a scaling point)")
    ap.add_argument("--name", help="the tree's name and commit, for the table")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    jobs = os.cpu_count() or 1
    t = Timings()
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="alloc-audit-bench-") as tmp:
        tmpdir = Path(tmp)
        root = copy_tree(trees, tmpdir)
        facts = tree_facts(root)
        caches = iter(tmpdir / f"cache{i}" for i in range(1000))
        print(f"tree: {facts}", file=sys.stderr)
        cold_n_what = f"alloc-audit scan, cold, --jobs {jobs}"
        if args.cold_only:
            for _ in range(args.runs):
                scan_json(root, next(caches), jobs, timings=t, what=cold_n_what)
            load.append(os.getloadavg())
            line = (f"| {facts['lines']:,} | {facts['files']} | {t.med(cold_n_what):.2f} | "
                    f"{t.cpu_med(cold_n_what):.2f} | {' '.join(f'{x:.2f}' for x in t.wall[cold_n_what])} | "
                    f"{load[0][0]:.1f} / {load[-1][0]:.1f} |")
            print(line)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
            return
        must_read = parsed_files(root, next(caches))
        must_bytes = sum(f.stat().st_size for f in must_read)
        parse_errors = floor.parse_all(root)[1]
        regex_hits = floor.regex_census(root, prefilter=True)[1]
        sg_version = semgrep_version(args.semgrep)
        ag_hits = sg_hits = None
        docs = []
        for i in range(args.runs):
            print(f"round {i + 1}, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
            t.inproc("read every byte", lambda: floor.read_all(root))
            t.inproc("parse every file, 1 process", lambda: floor.parse_all(root)[0])
            t.inproc("parse the files alloc-audit reads, 1 process", lambda: floor.parse_files(must_read, 1))
            t.inproc(f"parse the files alloc-audit reads, {jobs} processes",
                     lambda: floor.parse_files(must_read, jobs))
            t.inproc("per-line regex census + byte pre-filter", lambda: floor.regex_census(root, prefilter=True)[0])
            docs.append(scan_json(root, next(caches), 1, timings=t, what="alloc-audit scan, cold, --jobs 1")[1])
            ag_hits = run_ast_grep(root, 1, t, "ast-grep literal census, 1 thread")
            docs.append(scan_json(root, next(caches), jobs, timings=t, what=cold_n_what)[1])
            ag_hits = run_ast_grep(root, jobs, t, f"ast-grep literal census, {jobs} threads")
            if sg_version:
                sg_hits = semgrep_once(root, args.semgrep_rules, args.semgrep, t, f"semgrep census ruleset, -j {jobs}")
            scan_json(root, next(caches), jobs, ["--no-rules"], timings=t,
                      what=f"alloc-audit scan --no-rules (census only), cold, --jobs {jobs}")
        warm_what = f"alloc-audit scan, warm, --jobs {jobs}"
        warm_cache = next(caches)
        scan_json(root, warm_cache, jobs)
        for _ in range(args.runs):
            docs.append(scan_json(root, warm_cache, jobs, timings=t, what=warm_what)[1])
        docs.append(scan_json(root, next(caches), 4)[1])  # --jobs 4, cold
        identical = all(d == docs[0] for d in docs)
        doc = docs[0]

        # the pre-commit path: an allowlist, 20 files
        subprocess.run([*CLI, "allowlist", "init", "--force", "--no-cache"], cwd=root, capture_output=True,
                       check=True)
        files = pick_files(doc)
        check_cmd = [*CLI, "check", "--fail-on", "never", *files]
        sh([*check_cmd, "--cache-dir", str(warm_cache)], root)
        for _ in range(args.runs):
            t.sh("alloc-audit check, 20 files, cold cache", [*check_cmd, "--cache-dir", str(next(caches))], root)
            t.sh("alloc-audit check, 20 files, warm cache", [*check_cmd, "--cache-dir", str(warm_cache)], root)
            t.sh("alloc-audit --version", [*CLI, "--version"], root)
        rss_parent, rss_worker = rss_of_cold_scan(root, next(caches), jobs)
        load.append(os.getloadavg())

    med, cpu = t.med, t.cpu_med
    cold = med(cold_n_what)
    warm = med(warm_what)
    ag_n = med(f"ast-grep literal census, {jobs} threads")
    sg = med(f"semgrep census ruleset, -j {jobs}")
    floor_n = med(f"parse the files alloc-audit reads, {jobs} processes")
    census = med(f"alloc-audit scan --no-rules (census only), cold, --jobs {jobs}")
    check_cold = med("alloc-audit check, 20 files, cold cache")
    check_warm = med("alloc-audit check, 20 files, warm cache")
    sites = sum(1 for s in doc["sites"] if s["via"] is None and s["kind"] != "release")
    derived = sum(1 for s in doc["sites"] if s["via"] is not None)
    by_rule: dict[str, int] = {}
    for f in doc["findings"]:
        by_rule[f["rule"]] = by_rule.get(f["rule"], 0) + 1

    def ratio(a: float | None, b: float | None) -> str:
        return "n/a" if not a or not b else f"{a / b:.2f}x"

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    notes = {
        "parse every file, 1 process": f"{parse_errors} files with syntax errors",
        "parse the files alloc-audit reads, 1 process": f"{len(must_read)} files, {must_bytes / 1e6:.1f} MB",
        "per-line regex census + byte pre-filter": f"{regex_hits} hits",
        "ast-grep literal census, 1 thread": f"{ag_hits} matches",
        f"semgrep census ruleset, -j {jobs}": f"{sg_hits} hits; {sg_version}",
        cold_n_what: f"{sites} sites (+{derived} derived), {len(doc['findings'])} findings, "
                     f"{doc['stats']['parsed']} files parsed",
    }
    name = args.name or " + ".join(tr.name for tr in trees)
    out = [
        f"## {name}",
        "",
        f"{facts['files']} source files ({facts['py']} .py, {facts['native']} C++/CUDA), {facts['lines']:,} lines, "
        f"{facts['bytes'] / 1e6:.1f} MB. Machine: {platform.machine()}, {jobs} CPUs (shared), Python "
        f"{platform.python_version()}; load average (1/5/15 min) {' '.join(f'{x:.2f}' for x in load[0])} at the "
        f"start, {' '.join(f'{x:.2f}' for x in load[-1])} at the end. Medians of {args.runs} rounds, tools "
        "alternated within each round; wall clock and CPU (user + system of the process tree); CLI runs include "
        "interpreter start-up, the floors are in-process.",
        "",
        "| what | wall s | CPU s | runs (wall) | notes |",
        "|---|--:|--:|---|---|",
    ]
    out += [f"| {what} | {fmt(med(what))} | {fmt(cpu(what))} | {' '.join(f'{x:.2f}' for x in t.wall[what])} | "
            f"{notes.get(what, '')} |" for what in t.wall]
    out += [
        "",
        "| goal (issue 15) | measured | met |",
        "|---|---|---|",
        f"| 1. cold scan no slower than ast-grep's literal census ({jobs} threads) | cold = {ratio(cold, ag_n)} "
        f"ast-grep | {'yes' if ag_n and cold <= ag_n else 'no'} |",
        f"| 1. cold scan >= 6x faster than semgrep | {ratio(sg, cold)} faster | "
        f"{'yes' if sg and sg / cold >= 6 else 'no'} |",
        f"| 1. cold scan within 1.5x of the {jobs}-process parse of the files it reads | {ratio(cold, floor_n)} | "
        f"{'yes' if floor_n and cold <= 1.5 * floor_n else 'no'} |",
        f"| 2. warm <= 5 % of cold | {100 * warm / cold:.1f} % | {'yes' if warm <= 0.05 * cold else 'no'} |",
        f"| 2. check on 20 files <= 0.25 s warm, <= 0.8 s cold | {check_warm:.2f} s / {check_cold:.2f} s | "
        f"{'yes' if check_warm <= 0.25 and check_cold <= 0.8 else 'no'} |",
        f"| 3. peak RSS of the cold scan <= 500 MB | parent {rss_parent:.0f} MB, largest worker {rss_worker:.0f} MB | "
        f"{'yes' if max(rss_parent, rss_worker) <= 500 else 'no'} |",
        f"| 3. output identical for --jobs 1/{jobs}/4, cold/warm (JSON minus stats.seconds) | "
        f"{'identical' if identical else 'DIFFERENT'} | {'yes' if identical else 'no'} |",
        f"| (issue 4) all rules within 2x of the census-only time | {ratio(cold, census)} | "
        f"{'yes' if census and cold <= 2 * census else 'no'} |",
        "",
        "Findings by rule: " + (", ".join(f"{k} {v}" for k, v in sorted(by_rule.items())) or "none") + ".",
        "",
    ]
    text = "\n".join(out)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
