#!/usr/bin/env python3
"""CPU seconds of the per-file phase, in one process, by stage: the
pre-filter (with the identifiers of the files it skips: what the expansion
asks of them), the tree-sitter parse and the extraction of the files that
pass, per language. No cache, no workers, no whole-project stages: the part
of a cold scan that issue 15 asks to bring near the parse.

    python bench/per_file.py TREE [TREE ...] [--rounds 3]

Runs the alloc_audit that Python imports; for the code before a change,
`git archive COMMIT | tar -x -C DIR` and run with `PYTHONPATH=DIR`. Reports
the minimum over rounds of each stage's process time (the machine is shared:
the minimum is the least disturbed)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.model import Language
from alloc_audit.pipeline import expand
from alloc_audit.pipeline.discover import discover_files
from alloc_audit.pipeline.extract import extract_facts
from alloc_audit.pipeline.parse import parse_source


def one_round(trees: list[Path]) -> dict[str, float]:
    clock = time.process_time
    total: dict[str, float] = {}

    def add(key: str, seconds: float) -> None:
        total[key] = total.get(key, 0.0) + seconds

    for root in trees:
        config = load_config(root, None)
        catalog = load_catalog(config)
        apis, prefilter = catalog.apis, catalog.prefilter
        screen = getattr(prefilter, "screen", None)  # one pass (issue 15); before it, passes + identifiers
        for source in discover_files(config, [root]).files:
            data = Path(source.abspath).read_bytes()
            if b"\0" in data[:8192]:
                continue
            lang = "py" if source.language is Language.PYTHON else "native"
            t0 = clock()
            if screen is not None:
                skipped = screen(data, source.language) is not None
            else:
                skipped = not prefilter.passes(data, source.language)
                if skipped:
                    expand.identifiers(data)
            add("pre-filter + identifiers", clock() - t0)
            if skipped:
                continue
            t0 = clock()
            parsed = parse_source(data, source.language, apis.attribute_macros, apis.specifier_macros,
                                  apis.lone_macro_lines)
            add(f"parse {lang}", clock() - t0)
            t0 = clock()
            extract_facts(source.path, source.language, parsed, apis)
            add(f"extract {lang}", clock() - t0)
            add(f"files {lang}", 1)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", type=Path, nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rounds = [one_round(args.trees) for _ in range(args.rounds)]
    best = {key: min(r[key] for r in rounds) for key in rounds[0]}
    for key in sorted(best):
        print(f"{key:26s} {best[key]:8.2f}" if not key.startswith("files") else f"{key:26s} {int(best[key]):8d}")


if __name__ == "__main__":
    main()
