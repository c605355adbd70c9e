"""A mutational fuzzer for alloc-audit's scan (issue 14).

Seeds are the project's own Python, C++ and CUDA files (tests/fixtures/,
examples/), plus any tree given with --seeds (a public checkout on disk, for
the long run; nothing from it is written to the repository). Each input is a
seed with 1-3 mutations: byte and token spans deleted, duplicated or swapped,
unbalanced brackets and quotes, `<<<`, NUL and invalid UTF-8 bytes,
truncation, a very long name, deep nesting (brackets, braces, indentation; up
to 600 levels).

Inputs are scanned in batches by the installed CLI in a subprocess
(`scan --format json --no-cache --jobs 1`), and every batch is checked:

- crash: the process died on a signal or exited with a code other than 0;
- traceback: "Traceback" on stderr;
- invalid JSON on stdout;
- hang: a file that alone takes more than 10 s of CPU (a batch over 10 s is
  split and its files are timed one by one; CPU time, so a busy machine does
  not fake hangs; a wall-clock timeout backs it up);
- dropped sites: an `internal error` or a parser crash in `errors` (the
  file's sites were lost to a bug; files refused for a stated reason — binary,
  nesting Python forbids — are listed under errors as not analysed, which is
  the honest outcome and is counted apart);
- jobs: every --jobs-every'th batch is scanned again with --jobs 2 through the
  process pool (each batch holds a 1 MB filler file so the pool is used) and
  must give the same sites and errors.

Failing inputs are kept under --keep (default bench/results/fuzz-failures/,
git-ignored by its own .gitignore) with the batch's stderr.

    python bench/fuzz.py --per-language 10000 --seeds /work/trees/flashinfer \\
        --report bench/results/fuzz.md          # the long run (~1 h on 2 CPUs)
    python bench/fuzz.py --per-language 40 --seed 1   # what tests/test_fuzz.py runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LANGUAGES = {"python": (".py",), "cpp": (".cpp", ".cc", ".h", ".hpp"), "cuda": (".cu", ".cuh")}
OUT_SUFFIX = {"python": ".py", "cpp": ".cpp", "cuda": ".cu"}
HANG_SECONDS = 10.0
MAX_SEED_BYTES = 200_000


# ---------------------------------------------------------------- seeds


def find_seeds(roots: list[Path], language: str, limit: int = 400) -> list[bytes]:
    """Seed files of one language: the repository's own fixtures and
    examples first, then files from the extra roots (sorted, capped)."""
    suffixes = LANGUAGES[language]
    found: list[bytes] = []
    for root in roots:
        paths = sorted(p for p in root.rglob("*") if p.suffix in suffixes and p.is_file() and not p.is_symlink())
        for path in paths[:limit]:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if 0 < len(data) <= MAX_SEED_BYTES:
                found.append(data)
    return found


# ---------------------------------------------------------------- mutations

Mutation = Callable[[random.Random, bytes, str], bytes]


def _span(rng: random.Random, data: bytes, most: int = 400) -> tuple[int, int]:
    if not data:
        return 0, 0
    start = rng.randrange(len(data))
    return start, min(len(data), start + rng.randint(1, most))


def delete_span(rng: random.Random, data: bytes, _lang: str) -> bytes:
    a, b = _span(rng, data)
    return data[:a] + data[b:]


def duplicate_span(rng: random.Random, data: bytes, _lang: str) -> bytes:
    a, b = _span(rng, data)
    at = rng.randrange(len(data) + 1)
    return data[:at] + data[a:b] + data[at:]


def swap_spans(rng: random.Random, data: bytes, _lang: str) -> bytes:
    a, b = _span(rng, data, 200)
    c, d = _span(rng, data, 200)
    if b > c and d > a:  # overlapping: just move one
        return data[:a] + data[b:] + data[a:b]
    (a, b), (c, d) = sorted([(a, b), (c, d)])
    return data[:a] + data[c:d] + data[b:c] + data[a:b] + data[d:]


def _tokens(data: bytes) -> list[bytes]:
    import re

    return re.findall(rb"\w+|\s+|.", data, re.S)


def token_edit(rng: random.Random, data: bytes, _lang: str) -> bytes:
    tokens = _tokens(data)
    if len(tokens) < 2:
        return data
    i, j = rng.randrange(len(tokens)), rng.randrange(len(tokens))
    what = rng.choice(("delete", "duplicate", "swap"))
    if what == "delete":
        del tokens[i:i + rng.randint(1, 5)]
    elif what == "duplicate":
        tokens[j:j] = tokens[i:i + rng.randint(1, 8)]
    else:
        tokens[i], tokens[j] = tokens[j], tokens[i]
    return b"".join(tokens)


def insert_junk(rng: random.Random, data: bytes, _lang: str) -> bytes:
    junk = rng.choice([b"(", b")", b"[", b"]", b"{", b"}", b'"', b"'", b'"""', b"<<<", b">>>", b"<<<1, 2>>>",
                       b"\0", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\\", b"#", b"/*", b"*/", b"//", b"\r",
                       b"@", b"::", b"<", b">", b"template<", b"#define X(", b"#if 0\n", b"#endif\n", b"\t"])
    at = rng.randrange(len(data) + 1)
    return data[:at] + junk * rng.randint(1, 3) + data[at:]


def truncate(rng: random.Random, data: bytes, _lang: str) -> bytes:
    return data[:rng.randrange(len(data) + 1)]


def long_name(rng: random.Random, data: bytes, lang: str) -> bytes:
    name = b"n" * rng.choice((199, 200, 201, 250, 1000))
    call = name + b"." + name + b"(x)" if lang == "python" else name + b"::" + name + b"(x);"
    lines = data.split(b"\n")
    at = rng.randrange(len(lines) + 1)
    indent = lines[at - 1][:len(lines[at - 1]) - len(lines[at - 1].lstrip())] if 0 < at <= len(lines) else b""
    lines.insert(at, indent + call)
    return b"\n".join(lines)


def deep_nesting(rng: random.Random, data: bytes, lang: str) -> bytes:
    depth = rng.choice((50, 120, 300, 511, 520, 600))
    kind = rng.choice(("brackets", "indent") if lang == "python" else ("brackets", "braces"))
    if kind == "indent":
        block = b"".join(b"    " * i + b"if x:\n" for i in range(depth)) + b"    " * depth + b's = "s"\n'
    elif kind == "braces":
        block = b"void deep() {" + b"{" * depth + b'const char* s = "s";' + b"}" * depth + b"}\n"
    else:
        block = b"x = " + b"(" * depth + b'"s"' + b")" * depth + (b"\n" if lang == "python" else b";\n")
    lines = data.split(b"\n")
    at = rng.randrange(len(lines) + 1)
    return b"\n".join(lines[:at]) + b"\n" + block + b"\n".join(lines[at:])


MUTATIONS: tuple[Mutation, ...] = (delete_span, duplicate_span, swap_spans, token_edit, token_edit, insert_junk,
                                   insert_junk, truncate, long_name, deep_nesting)


def mutate(rng: random.Random, seed: bytes, lang: str) -> tuple[bytes, list[str]]:
    data = seed
    applied = []
    for _ in range(rng.randint(1, 3)):
        mutation = rng.choice(MUTATIONS)
        data = mutation(rng, data, lang)
        applied.append(mutation.__name__)
    return data, applied


# ---------------------------------------------------------------- running


@dataclass
class Tally:
    inputs: Counter[str] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    invalid_json: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    jobs_mismatch: list[str] = field(default_factory=list)
    not_analysed: Counter[str] = field(default_factory=Counter)  # honest refusals, by reason
    sites: int = 0
    slowest: float = 0.0
    batches: int = 0

    @property
    def failures(self) -> int:
        return sum(len(x) for x in (self.crashes, self.tracebacks, self.invalid_json, self.hangs, self.dropped,
                                    self.jobs_mismatch))


def cli_command() -> list[str]:
    exe = shutil.which("alloc-audit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return [exe] if exe else [sys.executable, "-m", "alloc_audit"]


def run_scan(directory: Path, jobs: int, timeout: float) -> tuple[int | None, str, str, float]:
    """Exit code (None: killed at ``timeout``), stdout, stderr and the CPU
    seconds the scan used: CPU time, not wall time, so that a busy shared
    machine does not make every batch look hung."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run([*cli_command(), "scan", str(directory), "--format", "json", "--no-cache",
                               "--jobs", str(jobs), "--no-progress"], capture_output=True, text=True,
                              timeout=timeout, cwd=directory, env={**os.environ, "NO_COLOR": "1"})
    except subprocess.TimeoutExpired:
        return None, "", "", timeout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.returncode, proc.stdout, proc.stderr, cpu


def _essence(doc: dict) -> tuple[object, ...]:
    return (json.dumps(doc["sites"], sort_keys=True), json.dumps(doc["errors"], sort_keys=True))


def check_batch(directory: Path, names: list[str], tally: Tally, keep: Path | None, with_jobs: bool) -> None:
    tally.batches += 1
    code, out, err, seconds = run_scan(directory, 1, timeout=max(120.0, HANG_SECONDS * len(names)))
    label = f"batch {tally.batches}"
    if code is None or seconds > HANG_SECONDS:
        # split: which file alone takes more than 10 s?
        for name in names:
            alone = directory.parent / f"{directory.name}-alone"
            shutil.rmtree(alone, ignore_errors=True)
            alone.mkdir()
            (alone / "alloc-audit.toml").write_text("# fuzz\n")
            shutil.copy(directory / name, alone / name)
            c, _o, _e, s = run_scan(alone, 1, timeout=HANG_SECONDS * 6)
            tally.slowest = max(tally.slowest, s)
            if c is None or s > HANG_SECONDS:
                tally.hangs.append(f"{label}/{name} ({'timeout' if c is None else f'{s:.1f} s'})")
                _keep(keep, directory / name, "hang")
            shutil.rmtree(alone, ignore_errors=True)
        if code is None:
            return
    else:
        tally.slowest = max(tally.slowest, seconds / max(1, len(names)))
    if code != 0:
        tally.crashes.append(f"{label}: exit {code}")
        _keep_all(keep, directory, names, err, "crash")
    if "Traceback" in err:
        tally.tracebacks.append(label)
        _keep_all(keep, directory, names, err, "traceback")
    try:
        doc = json.loads(out)
    except ValueError:
        tally.invalid_json.append(label)
        _keep_all(keep, directory, names, err, "invalid-json")
        return
    tally.sites += len(doc["sites"])
    for error in doc["errors"]:
        message = error["message"]
        if "internal error" in message or "crashed" in message:
            tally.dropped.append(f"{label}/{error['path']}: {message}")
            _keep(keep, directory / error["path"], "dropped")
        elif not error.get("analysed", True):
            tally.not_analysed[message.split(";")[0].split(" (")[0]] += 1
    if with_jobs:
        code2, out2, err2, _s = run_scan(directory, 2, timeout=max(120.0, HANG_SECONDS * len(names)))
        try:
            same = code2 == code and _essence(json.loads(out2)) == _essence(doc)
        except ValueError:
            same = False
        if not same:
            tally.jobs_mismatch.append(label)
            _keep_all(keep, directory, names, err2, "jobs")


def _keep(keep: Path | None, path: Path, why: str) -> None:
    if keep is None or not path.exists():
        return
    target = keep / why
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, target / f"{int(time.time() * 1000)}-{path.name}")


def _keep_all(keep: Path | None, directory: Path, names: list[str], err: str, why: str) -> None:
    if keep is None:
        return
    target = keep / why / f"batch-{int(time.time() * 1000)}"
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(directory / name, target / name)
    (target / "stderr.txt").write_text(err)


def fuzz(per_language: int, seed: int, extra_seeds: list[Path], batch: int, jobs_every: int,
         keep: Path | None, progress: Callable[[Tally], None] | None = None,
         languages: tuple[str, ...] = ("python", "cpp", "cuda")) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    roots = [REPO / "tests" / "fixtures", REPO / "examples", *extra_seeds]
    with tempfile.TemporaryDirectory(prefix="alloc-audit-fuzz-") as tmp:
        work = Path(tmp) / "batch"
        for lang in languages:
            seeds = find_seeds(roots, lang)
            if not seeds:
                raise SystemExit(f"no {lang} seeds found")
            done = 0
            while done < per_language:
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                (work / "alloc-audit.toml").write_text("# fuzz\n")
                # a 1 MB file without sites: with it, --jobs 2 takes the
                # process pool (small runs are done in one process)
                (work / "filler.py").write_bytes(b"x = 1\n" * 180_000)
                names = []
                for i in range(min(batch, per_language - done)):
                    data, _applied = mutate(rng, rng.choice(seeds), lang)
                    name = f"f{done + i:06d}{OUT_SUFFIX[lang]}"
                    (work / name).write_bytes(data)
                    names.append(name)
                check_batch(work, names, tally, keep, jobs_every > 0 and tally.batches % jobs_every == 0)
                done += len(names)
                tally.inputs[lang] += len(names)
                if progress:
                    progress(tally)
    return tally


def summary(tally: Tally, seconds: float, command: str) -> str:
    lines = [
        "# Fuzz run",
        "",
        f"Command: `{command}`",
        "",
        "| language | inputs |", "|---|---|",
        *(f"| {lang} | {n:,} |" for lang, n in sorted(tally.inputs.items())),
        "",
        f"Batches: {tally.batches}; wall time {seconds / 60:.1f} min; CPU per file: worst batch average, or the slowest file timed alone, {tally.slowest:.2f} s; "
        f"sites reported {tally.sites:,}.",
        "",
        "| check | failures |", "|---|---|",
        f"| crash (signal or exit != 0) | {len(tally.crashes)} |",
        f"| traceback | {len(tally.tracebacks)} |",
        f"| invalid JSON | {len(tally.invalid_json)} |",
        f"| hang (> {HANG_SECONDS:.0f} s per file) | {len(tally.hangs)} |",
        f"| dropped sites (internal error, parser crash) | {len(tally.dropped)} |",
        f"| --jobs 1 vs --jobs 2 differ | {len(tally.jobs_mismatch)} |",
        "",
        "Files refused for a stated reason (listed under `errors`, `analysed: false`; their allowlist entries are "
        "'not checked'):",
        "",
        *(f"- {reason}: {n:,}" for reason, n in tally.not_analysed.most_common()),
    ]
    for title, items in (("crashes", tally.crashes), ("tracebacks", tally.tracebacks), ("invalid JSON",
                         tally.invalid_json), ("hangs", tally.hangs), ("dropped", tally.dropped),
                         ("jobs mismatch", tally.jobs_mismatch)):
        if items:
            lines += ["", f"## {title}", "", *(f"- {x}" for x in items[:50])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-language", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=Path, action="append", default=[],
                        help="an extra tree of seed files (a public checkout on disk)")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--jobs-every", type=int, default=10, help="compare with --jobs 2 every N batches (0: never)")
    parser.add_argument("--keep", type=Path, default=REPO / "bench" / "results" / "fuzz-failures")
    parser.add_argument("--report", type=Path, help="write the summary (Markdown) here as the run goes")
    args = parser.parse_args(argv)
    command = "python bench/fuzz.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        (args.keep / ".gitignore").write_text("*\n")

    def progress(tally: Tally) -> None:
        if args.report and tally.batches % 5 == 0:
            args.report.write_text(summary(tally, time.perf_counter() - started, command + "  (in progress)"))
        print(f"\r{dict(tally.inputs)} failures={tally.failures}", end="", file=sys.stderr, flush=True)

    tally = fuzz(args.per_language, args.seed, args.seeds, args.batch, args.jobs_every, args.keep, progress)
    text = summary(tally, time.perf_counter() - started, command)
    if args.report:
        args.report.write_text(text)
    print(file=sys.stderr)
    print(text)
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
