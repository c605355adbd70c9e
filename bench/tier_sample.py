"""Stratified tier samples for hand judging, and their scores (issue 11).

``sample``: from a scan's JSON, draw a reproducible stratified sample and
write a judging sheet (Markdown). Strata, in order: direct sites by tier
(T1, T2, T3, T4, T5a, T5b, unknown), then derived sites (``via`` set). From
each stratum of size s, min(s, max(MIN, round(TARGET * s / N))) sites are
drawn with one ``random.Random(seed)`` in stratum order (a stratum taken
whole uses no draw). Sites are sorted by (path, line, col, api) first, so
the sample depends only on the scan and the seed.

``score``: read a judged sheet (the judge filled ``verdict`` with
``right``, ``wrong`` or ``not-a-site``, and ``judge tier`` where wrong) and
print per-stratum accuracy, overall accuracy, accuracy on real sites only,
and the population-weighted estimate.

``rescore``: score a new scan against an old judged sheet: a sampled site
the judge called wrong counts as right when its tier in the new scan is
the judge's; a not-a-site counts as right when the site is gone; a right
one stays right when its tier is unchanged. Sites are matched by (path,
line, api). For tuning trees only: the sample came from the old scan.

    python bench/tier_sample.py sample SCAN.json --seed 11 -o SHEET.md
    python bench/tier_sample.py score SHEET.md
    python bench/tier_sample.py rescore SHEET.md NEW_SCAN.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

TIERS = ("T1", "T2", "T3", "T4", "T5a", "T5b", "unknown")
COLUMNS = (
    "#", "stratum", "site", "api", "kind", "role", "tool tier", "tool reason",
    "verdict", "judge tier", "reason (one line)",
)


def stratum(site: dict[str, Any]) -> str:
    return "derived" if site.get("via") else str(site.get("tier") or "unknown")


def strata(sites: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    ordered = sorted(sites, key=lambda s: (s["path"], s["line"], s.get("col", 0), s["api"]))
    groups: dict[str, list[dict[str, Any]]] = {name: [] for name in (*TIERS, "derived")}
    for site in ordered:
        groups.setdefault(stratum(site), []).append(site)
    return groups


def draw(sites: list[dict[str, Any]], seed: int, target: int, minimum: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    total = len(sites)
    chosen: list[dict[str, Any]] = []
    for group in strata(sites).values():
        take = min(len(group), max(minimum, round(target * len(group) / max(total, 1))))
        chosen.extend(group if take == len(group) else sorted(
            rng.sample(group, take), key=lambda s: (s["path"], s["line"], s.get("col", 0), s["api"])))
    return chosen


def cell(text: object) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def sheet(scan: dict[str, Any], chosen: list[dict[str, Any]], seed: int, source: str) -> str:
    sizes = Counter(stratum(s) for s in scan["sites"])
    taken = Counter(stratum(s) for s in chosen)
    lines = [
        f"# Tier judging sheet: {source}",
        "",
        f"Tool: {scan.get('tool', {})}; seed {seed}; {len(scan['sites'])} sites; "
        f"{len(chosen)} sampled.",
        "",
        "Strata (size -> taken): " + ", ".join(
            f"{name} {sizes[name]}->{taken[name]}" for name in (*TIERS, "derived") if sizes[name]),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for number, site in enumerate(chosen, 1):
        row = (number, stratum(site), f"{site['path']}:{site['line']}", f"`{site['api']}`",
               site.get("kind"), site.get("role"), site.get("tier"), site.get("tier_reason"), "", "", "")
        lines.append("| " + " | ".join(cell(value) for value in row) + " |")
    return "\n".join(lines) + "\n"


def read_sheet(path: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith("| #"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in line.strip().strip("|").split(" | ")]
        if len(cells) != len(COLUMNS) or not cells[0].isdigit():
            continue
        rows.append(dict(zip(COLUMNS, cells)))
    return rows


def verdict_of(row: dict[str, str]) -> str:
    verdict = row["verdict"].lower()
    if verdict not in {"right", "wrong", "not-a-site"}:
        raise SystemExit(f"row {row['#']} ({row['site']}): verdict {row['verdict']!r} "
                         "is not right, wrong or not-a-site")
    return verdict


def table(rows: list[dict[str, str]], verdicts: list[str], sizes: Counter[str] | None) -> str:
    out = ["| stratum | n | right | wrong | not-a-site | accuracy | real sites only |",
           "|---|--:|--:|--:|--:|--:|--:|"]
    weighted = 0.0
    names = [n for n in (*TIERS, "derived") if any(r["stratum"] == n for r in rows)]
    for name in (*names, "all"):
        picked = [v for r, v in zip(rows, verdicts) if name in ("all", r["stratum"])]
        count = Counter(picked)
        real = len(picked) - count["not-a-site"]
        accuracy = count["right"] / len(picked)
        out.append(f"| {name} | {len(picked)} | {count['right']} | {count['wrong']} | "
                   f"{count['not-a-site']} | {accuracy:.1%} | "
                   f"{(count['right'] / real if real else 0):.1%} |")
        if sizes and name != "all":
            weighted += accuracy * sizes[name]
    if sizes:
        out.append(f"\nPopulation-weighted estimate: {weighted / sum(sizes[n] for n in names):.1%}")
    frees = [v for r, v in zip(rows, verdicts) if r.get("kind", "").strip("`") == "release"]
    if frees:  # a free is right with any tier: the allocations alone say more
        allocations = [v for r, v in zip(rows, verdicts) if r.get("kind", "").strip("`") != "release"]
        right = sum(v == "right" for v in allocations)
        out.append(f"\nAllocations only ({len(frees)} frees left out): {right}/{len(allocations)} "
                   f"({right / max(len(allocations), 1):.1%})")
    return "\n".join(out)


def _same_call(api: str) -> str:
    return "Tensor." + api[len("Module."):] if api.startswith("Module.") else api


def rescored(rows: list[dict[str, str]], scan: dict[str, Any]) -> list[str]:
    # `Tensor.to` and `Module.to` name one call: a module move told later is the same site
    now = {(s["path"], s["line"], _same_call(s["api"])): s for s in scan["sites"]}
    out = []
    for row in rows:
        path, line = row["site"].rsplit(":", 1)
        site = now.get((path, int(line), _same_call(row["api"].strip("`"))))
        verdict = verdict_of(row)
        if verdict == "not-a-site":
            out.append("right" if site is None else "not-a-site")
        elif site is None:
            out.append("wrong")
        elif verdict == "right" and site.get("kind") == "release":
            out.append("right")  # a free is right with any tier (the judges' convention)
        else:
            expected = row["tool tier"] if verdict == "right" else row["judge tier"]
            out.append("right" if site.get("tier") == expected else "wrong")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sample = sub.add_parser("sample")
    sample.add_argument("scan", type=Path)
    sample.add_argument("--seed", type=int, required=True)
    sample.add_argument("--target", type=int, default=100)
    sample.add_argument("--min", type=int, default=12, dest="minimum")
    sample.add_argument("-o", "--out", type=Path)
    score = sub.add_parser("score")
    score.add_argument("sheet", type=Path)
    score.add_argument("--scan", type=Path, help="the scan the sheet was drawn from (for the weighted estimate)")
    again = sub.add_parser("rescore")
    again.add_argument("sheet", type=Path)
    again.add_argument("scan", type=Path)
    args = parser.parse_args(argv)
    if args.command == "sample":
        scan = json.loads(args.scan.read_text(encoding="utf-8"))
        chosen = draw(scan["sites"], args.seed, args.target, args.minimum)
        text = sheet(scan, chosen, args.seed, str(args.scan))
        if args.out:
            args.out.write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return 0
    rows = read_sheet(args.sheet)
    if not rows:
        raise SystemExit(f"{args.sheet}: no judged rows found")
    if args.command == "score":
        sizes = None
        if args.scan:
            sizes = Counter(stratum(s) for s in json.loads(args.scan.read_text(encoding="utf-8"))["sites"])
        print(table(rows, [verdict_of(r) for r in rows], sizes))
        return 0
    scan = json.loads(args.scan.read_text(encoding="utf-8"))
    print(table(rows, rescored(rows, scan), None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
