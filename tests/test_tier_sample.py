"""bench/tier_sample.py: the stratified sample is reproducible, covers every
stratum, and the scores count what the judge wrote."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("alloc_audit_tier_sample", REPO / "bench" / "tier_sample.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def scan() -> dict[str, Any]:
    sites = []
    for index in range(200):
        tier = ("T1", "T2", "T4", "T4", "T4")[index % 5]
        via = {"api": "x", "path": "a.py", "line": 1} if index % 40 == 0 else None
        sites.append({"path": f"pkg/m{index % 7}.py", "line": index, "col": 1, "api": "torch.empty",
                      "kind": "device", "role": "production", "tier": tier, "tier_reason": "r", "via": via})
    return {"tool": {"version": "t"}, "sites": sites}


def judged(sheet: str, verdict_for: dict[int, tuple[str, str]]) -> str:
    out = []
    for line in sheet.splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and cells[0][2:].isdigit():
            verdict, tier = verdict_for.get(int(cells[0][2:]), ("right", ""))
            cells[-3], cells[-2], cells[-1] = verdict, tier, "because |"
            line = " | ".join(cells)
        out.append(line)
    return "\n".join(out) + "\n"


def test_sample_is_reproducible_and_stratified() -> None:
    tool = load()
    data = scan()
    first = tool.draw(data["sites"], 11, 100, 12)
    assert first == tool.draw(list(reversed(data["sites"])), 11, 100, 12)
    assert first != tool.draw(data["sites"], 12, 100, 12)
    taken = {tool.stratum(s) for s in first}
    assert taken == {"T1", "T2", "T4", "derived"}
    assert sum(1 for s in first if tool.stratum(s) == "derived") == 5  # the whole stratum: 5 < 12


def test_score_and_rescore(tmp_path: Path) -> None:
    tool = load()
    data = scan()
    chosen = tool.draw(data["sites"], 11, 100, 12)
    sheet = tool.sheet(data, chosen, 11, "scan.json")
    path = tmp_path / "sheet.md"
    path.write_text(judged(sheet, {1: ("wrong", "T2"), 2: ("not-a-site", "")}), encoding="utf-8")
    rows = tool.read_sheet(path)
    assert len(rows) == len(chosen)
    verdicts = [tool.verdict_of(r) for r in rows]
    assert verdicts.count("right") == len(chosen) - 2
    # Fix the first site's tier and drop the second: both count as right now.
    fixed = dict(data, sites=[dict(s) for s in data["sites"] if (s["path"], s["line"]) != (chosen[1]["path"], chosen[1]["line"])])
    for site in fixed["sites"]:
        if (site["path"], site["line"]) == (chosen[0]["path"], chosen[0]["line"]):
            site["tier"] = "T2"
    assert tool.rescored(rows, fixed).count("right") == len(chosen)
    assert tool.rescored(rows, data).count("right") == len(chosen) - 2
    # A `Tensor.X` site told a module move later (`Module.X`) is the same sampled site.
    first = next(s for s in fixed["sites"] if (s["path"], s["line"]) == (chosen[0]["path"], chosen[0]["line"]))
    first["api"], api = "Module.cuda", first["api"]
    assert tool.rescored(rows, fixed)[0] == ("right" if api == "Tensor.cuda" else "wrong")
    assert tool.rescored([dict(rows[0], api="`Tensor.cuda`")], fixed) == ["right"]
    (tmp_path / "scan.json").write_text(json.dumps(data), encoding="utf-8")
    assert tool.main(["score", str(path), "--scan", str(tmp_path / "scan.json")]) == 0


def test_score_says_the_allocations_alone_when_frees_were_sampled(tmp_path: Path) -> None:
    """A free is right with any tier (rescore's convention), so a sample
    with many frees reads better than the allocations are: the table adds
    the allocations-only figure whenever a free was sampled."""
    tool = load()
    data = scan()
    for site in data["sites"][:60]:
        site["kind"] = "release"
    chosen = tool.draw(data["sites"], 11, 100, 12)
    frees = sum(1 for s in chosen if s["kind"] == "release")
    assert frees
    path = tmp_path / "sheet.md"
    first_allocation = next(i for i, s in enumerate(chosen, 1) if s["kind"] != "release")
    path.write_text(judged(tool.sheet(data, chosen, 11, "scan.json"), {first_allocation: ("wrong", "T2")}),
                    encoding="utf-8")
    rows = tool.read_sheet(path)
    text = tool.table(rows, [tool.verdict_of(r) for r in rows], None)
    allocations = len(chosen) - frees
    assert f"Allocations only ({frees} frees left out): {allocations - 1}/{allocations}" in text
    plain = tool.table([dict(r, kind="device") for r in rows], [tool.verdict_of(r) for r in rows], None)
    assert "Allocations only" not in plain
