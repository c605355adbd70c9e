#!/usr/bin/env python3
"""Side-by-side benchmark of alloc-audit on a real engine tree.

    python bench/bench.py TREE [--runs 3] [--semgrep-runs 1] [--out bench/results/NAME.md]

Fetches nothing: TREE is a path you provide (a git work tree or a plain
directory). It is copied to a temporary directory first (a local `git clone`
when it is a repository), so the benchmark never writes into it; every
alloc-audit run uses its own cache directory there.

What it measures, each the median of --runs (wall clock, including the
interpreter's start-up for the CLI runs):

- the floor: reading every source byte; a single-process tree-sitter parse of
  every file (the grammars alloc-audit uses);
- alloc-audit `scan` (census + all rules): cold with --jobs 1 and --jobs N
  (N = CPUs), and warm (nothing changed, cache present);
- `check` on 20 files that hold sites (the pre-commit path), cold and warm,
  and `--version`;
- peak RSS of the cold scan (the parent process and the largest worker);
- the peers: semgrep with ../shared/bench/semgrep-census.yml (or --semgrep-rules),
  run as installed on PATH or --semgrep; a per-line regex census, with and
  without a byte pre-filter;
- byte-identical output: the JSON of jobs=1, jobs=N, cold and warm, compared
  with `stats.seconds` removed.

Prints a Markdown table of medians and ratios against the goals of issue 6,
and writes it to --out when given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def sh(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    # as installed software runs: with byte-compiled modules (some sandboxes
    # set PYTHONDONTWRITEBYTECODE, which adds ~0.05 s of compiling per run)
    full = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**full, **(env or {})})
    return time.perf_counter() - started, proc


def median_of(runs: int, fn) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(fn() for _ in range(runs))


def copy_tree(tree: Path, dest: Path) -> Path:
    target = dest / "tree"
    if (tree / ".git").exists():
        subprocess.run(["git", "clone", "-q", "--local", "--no-hardlinks", str(tree), str(target)], check=True)
    else:
        shutil.copytree(tree, target, symlinks=True)
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


def scan_json(root: Path, cache: Path, jobs: int, extra: list[str] | None = None) -> tuple[float, dict]:
    seconds, proc = sh([*CLI, "scan", ".", "--format", "json", "--jobs", str(jobs), "--cache-dir", str(cache),
                        *(extra or [])], root)
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


def pick_files(doc: dict, n: int = 20) -> list[str]:
    paths = sorted({s["path"] for s in doc["sites"] if s["via"] is None})
    if len(paths) <= n:
        return paths
    step = len(paths) / n
    return [paths[int(i * step)] for i in range(n)]


def run_semgrep(root: Path, rules: Path, semgrep: str, runs: int) -> tuple[float | None, int | None, str]:
    if not shutil.which(semgrep) and not Path(semgrep).exists():
        return None, None, "semgrep not installed"
    quiet = {**os.environ, "SEMGREP_SEND_METRICS": "off", "SEMGREP_ENABLE_VERSION_CHECK": "0"}
    version = subprocess.run([semgrep, "--version", "--disable-version-check"], capture_output=True, text=True,
                             env=quiet).stdout.strip()
    times, count = [], None
    for _ in range(runs):
        seconds, proc = sh([semgrep, "scan", "--config", str(rules), "--json", "--metrics=off",
                            "--disable-version-check", "--no-git-ignore", "-j", str(os.cpu_count() or 1),
                            "--timeout", "0", "--max-target-bytes", "2000000", "."], root,
                           {"SEMGREP_SEND_METRICS": "off", "SEMGREP_ENABLE_VERSION_CHECK": "0"})
        if proc.returncode not in (0, 1):
            return None, None, f"semgrep failed: {proc.stderr[-400:]}"
        count = len(json.loads(proc.stdout)["results"])
        times.append(seconds)
    # the fixed cost of one invocation: the same ruleset on an empty directory
    empty = root.parent / "empty"
    empty.mkdir(exist_ok=True)
    start, _ = sh([semgrep, "scan", "--config", str(rules), "--json", "--metrics=off", "--disable-version-check",
                   "."], empty, {"SEMGREP_ENABLE_VERSION_CHECK": "0"})
    return statistics.median(times), count, f"semgrep {version}, fixed start-up {start:.1f} s per invocation"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--semgrep-runs", type=int, default=1)
    ap.add_argument("--semgrep", default="semgrep")
    ap.add_argument("--semgrep-rules", type=Path, default=HERE.parent.parent / "shared" / "bench" / "semgrep-census.yml")
    ap.add_argument("--name", help="the tree's name and commit, for the table")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tree = args.tree.resolve()
    jobs = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="alloc-audit-bench-") as tmp:
        tmpdir = Path(tmp)
        root = copy_tree(tree, tmpdir)
        facts = tree_facts(root)
        caches = iter(tmpdir / f"cache{i}" for i in range(1000))
        print(f"tree: {facts}", file=sys.stderr)

        read_s = median_of(args.runs, lambda: floor.read_all(root))
        parse_s = median_of(args.runs, lambda: floor.parse_all(root)[0])
        parse_errors = floor.parse_all(root)[1]
        regex_s = median_of(args.runs, lambda: floor.regex_census(root, prefilter=False)[0])
        regex_pf_s = median_of(args.runs, lambda: floor.regex_census(root, prefilter=True)[0])
        regex_hits = floor.regex_census(root, prefilter=True)[1]

        cold_1 = []
        cold_n = []
        docs = []
        for _ in range(args.runs):
            s, d = scan_json(root, next(caches), 1)
            cold_1.append(s)
            docs.append(d)
            s, d = scan_json(root, next(caches), jobs)
            cold_n.append(s)
            docs.append(d)
        census = median_of(args.runs, lambda: scan_json(root, next(caches), jobs, ["--no-rules"])[0])
        warm_cache = next(caches)
        scan_json(root, warm_cache, jobs)
        warm = []
        for _ in range(args.runs):
            s, d = scan_json(root, warm_cache, jobs)
            warm.append(s)
            docs.append(d)
        identical = all(d == docs[0] for d in docs)
        doc = docs[0]

        # the pre-commit path: an allowlist, 20 files
        subprocess.run([*CLI, "allowlist", "init", "--no-cache"], cwd=root, capture_output=True,
                       check=True)
        files = pick_files(doc)
        check_cmd = [*CLI, "check", "--fail-on", "never", *files]
        check_cold = median_of(args.runs, lambda: sh([*check_cmd, "--cache-dir", str(next(caches))], root)[0])
        sh([*check_cmd, "--cache-dir", str(warm_cache)], root)
        check_warm = median_of(args.runs, lambda: sh([*check_cmd, "--cache-dir", str(warm_cache)], root)[0])
        version_s = median_of(args.runs, lambda: sh([*CLI, "--version"], root)[0])
        rss_parent, rss_worker = rss_of_cold_scan(root, next(caches), jobs)
        semgrep_s, semgrep_hits, semgrep_note = run_semgrep(root, args.semgrep_rules, args.semgrep,
                                                            args.semgrep_runs)

    cold = statistics.median(cold_n)
    sites = sum(1 for s in doc["sites"] if s["via"] is None and s["kind"] != "release")
    derived = sum(1 for s in doc["sites"] if s["via"] is not None)
    by_rule: dict[str, int] = {}
    for f in doc["findings"]:
        by_rule[f["rule"]] = by_rule.get(f["rule"], 0) + 1
    errors_by_lang: dict[str, int] = {}
    for e in doc["errors"]:
        ext = os.path.splitext(e["path"])[1] or "?"
        errors_by_lang[ext] = errors_by_lang.get(ext, 0) + 1

    def ratio(a: float | None, b: float | None) -> str:
        return "n/a" if not a or not b else f"{a / b:.2f}x"

    name = args.name or tree.name
    rows = [
        ("read every byte", read_s, ""),
        ("tree-sitter parse of every file, 1 process", parse_s, f"{parse_errors} files with syntax errors"),
        ("per-line regex census", regex_s, f"{regex_hits} hits"),
        ("per-line regex census + byte pre-filter", regex_pf_s, ""),
        (f"semgrep census ruleset, -j {jobs}", semgrep_s, f"{semgrep_hits} hits; {semgrep_note}"),
        ("alloc-audit scan, cold, --jobs 1", statistics.median(cold_1), ""),
        (f"alloc-audit scan, cold, --jobs {jobs}", cold, f"{sites} sites (+{derived} derived), "
                                                      f"{len(doc['findings'])} findings"),
        (f"alloc-audit scan --no-rules (census only), cold, --jobs {jobs}", census, ""),
        (f"alloc-audit scan, warm, --jobs {jobs}", statistics.median(warm), ""),
        ("alloc-audit check, 20 files, cold cache", check_cold, ""),
        ("alloc-audit check, 20 files, warm cache", check_warm, ""),
        ("alloc-audit --version", version_s, ""),
    ]
    out = [
        f"## {name}",
        "",
        f"{facts['files']} source files ({facts['py']} .py, {facts['native']} C++/CUDA), {facts['lines']:,} lines, "
        f"{facts['bytes'] / 1e6:.1f} MB. Machine: {platform.machine()}, {jobs} CPUs, Python "
        f"{platform.python_version()}. Medians of {args.runs} runs ({args.semgrep_runs} for semgrep), wall clock, "
        "CLI runs include interpreter start-up.",
        "",
        "| what | seconds | notes |",
        "|---|--:|---|",
    ]
    out += [f"| {what} | {'n/a' if s is None else f'{s:.2f}'} | {note} |" for what, s, note in rows]
    out += [
        "",
        "| goal (issue 6) | measured | met |",
        "|---|---|---|",
        f"| 1. cold scan >= 10x faster than semgrep | {ratio(semgrep_s, cold)} faster | "
        f"{'yes' if semgrep_s and semgrep_s / cold >= 10 else 'no'} |",
        f"| 1. cold scan faster than a 1-process parse of every file | cold = {cold / parse_s:.2f}x the parse | "
        f"{'yes' if cold < parse_s else 'no'} |",
        f"| 2. warm <= 10 % of cold | {100 * statistics.median(warm) / cold:.1f} % | "
        f"{'yes' if statistics.median(warm) <= 0.1 * cold else 'no'} |",
        f"| 3. check on 20 files <= 0.3 s warm, <= 1 s cold | {check_warm:.2f} s / {check_cold:.2f} s | "
        f"{'yes' if check_warm <= 0.3 and check_cold <= 1 else 'no'} |",
        f"| 4. peak RSS of the cold scan <= 500 MB | parent {rss_parent:.0f} MB, largest worker {rss_worker:.0f} MB | "
        f"{'yes' if max(rss_parent, rss_worker) <= 500 else 'no'} |",
        f"| (issue 4) all rules within 2x of the census-only time | {cold / census:.2f}x | "
        f"{'yes' if cold <= 2 * census else 'no'} |",
        f"| 5. output identical for jobs 1/{jobs}, cold/warm | {'identical' if identical else 'DIFFERENT'} | "
        f"{'yes' if identical else 'no'} |",
        "",
        "Findings by rule: " + (", ".join(f"{k} {v}" for k, v in sorted(by_rule.items())) or "none") + ".",
        "Files alloc-audit could not parse cleanly, by suffix: "
        + (", ".join(f"{k} {v}" for k, v in sorted(errors_by_lang.items())) or "none") + ".",
        "",
    ]
    text = "\n".join(out)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
