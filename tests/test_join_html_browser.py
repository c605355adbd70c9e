"""The ``join`` HTML report in a real headless Chromium (Debian's
``chromium``, driven by Playwright): no console errors, no network, the tier
bars and the timeline of live bytes per tier are drawn as inline SVG, the
joined-bytes table sorts. Slow; skipped without Chromium unless
ALLOC_AUDIT_REQUIRE_BROWSER is set (``.ci/run`` sets it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clihelp import run_cli

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "tests" / "data" / "runtime" / "minigen-python.pickle.gz"

pytestmark = pytest.mark.slow



def test_join_report_in_chromium(browser: Any, tmp_path: Path) -> None:
    out = tmp_path / "join.html"
    result = run_cli("join", str(SNAPSHOT), "examples", "-f", "html", "-o", str(out), cwd=REPO)
    assert result.code == 0, result.err
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: errors.append(f"network request: {r.url}") if not r.url.startswith(
        ("file:", "data:", "about:")) else None)
    page.goto(out.as_uri())
    page.wait_for_selector("html[data-ready='1']", timeout=20000)
    assert errors == []
    assert page.inner_text("#accounted-share-s") == "100.0%"
    # bytes per tier: a bar per tier with bytes, wider for more bytes
    bars = page.eval_on_selector_all("#tier-bars rect.bar", "rs => rs.map(r => [r.dataset.tier, "
                                     "r.getBoundingClientRect().width])")
    widths = dict(bars)
    assert {"T1", "T2", "T3", "T4"} <= set(widths)
    assert widths["T3"] > widths["T1"] > widths["T2"] > 0
    # the timeline: one polyline per tier, drawn over the replayed trace
    series = page.eval_on_selector_all("#timeline polyline.series",
                                       "ps => ps.map(p => [p.dataset.tier, p.points.numberOfItems])")
    assert {"T1", "T2", "T3", "T4"} <= {t for t, _ in series}
    assert all(n > 50 for _, n in series)
    assert page.eval_on_selector("#timeline", "s => s.getBoundingClientRect().height") > 100
    # the joined-bytes table: largest first; a click sorts by allocations
    first = page.eval_on_selector("#sites-s tbody tr", "r => r.cells[0].textContent")
    assert first.startswith("examples/minigen/worker.py:")
    page.click("#sites-s th:nth-child(7)")
    counts = page.eval_on_selector_all("#sites-s tbody tr", "rs => rs.map(r => Number(r.cells[6].textContent))")
    assert counts == sorted(counts, reverse=True) and counts[0] == 16
    assert "agrees" in page.inner_text("#sites-s") and "disagrees" not in page.inner_text("#sites-s")
