"""The HTML report in a real headless Chromium (Debian's ``chromium``, driven
by Playwright): it loads with no console errors, the charts render, the
table sorts and filters, it follows the colour scheme, and a 10k-site report
opens within a few seconds without putting 10k rows in the DOM.

Slow; skipped when no Chromium is installed unless ALLOC_AUDIT_REQUIRE_BROWSER
is set (``.ci/run`` sets it, so CI cannot skip it silently)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from clihelp import make_repo, run_cli

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow



def open_report(browser: Any, path: Path, scheme: str = "light") -> tuple[Any, list[str], float]:
    page = browser.new_page(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: errors.append(f"network request: {r.url}") if not r.url.startswith(
        ("file:", "data:", "about:")) else None)
    started = time.perf_counter()
    page.goto(path.as_uri())
    page.wait_for_selector("html[data-ready='1']", timeout=20000)
    return page, errors, time.perf_counter() - started


def visible_rows(page: Any) -> list[list[str]]:
    return page.eval_on_selector_all(
        "#site-rows tr:not(.spacer)", "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent))")


def test_demo_report_in_chromium(browser: Any, tmp_path: Path) -> None:
    out = tmp_path / "demo.html"
    assert run_cli("report", "examples", "-f", "html", "-o", str(out), cwd=REPO).code == 0
    page, errors, _ = open_report(browser, out)
    assert errors == []
    # the charts drew bars
    assert page.eval_on_selector_all("#chart-dirs svg rect.bar", "n => n.length") >= 5
    assert page.eval_on_selector_all("#chart-rules svg rect.bar", "n => n.length") >= 5
    box = page.eval_on_selector("#chart-dirs svg", "s => s.getBoundingClientRect().height")
    assert box > 50
    assert page.inner_text("#site-count") == "47 sites"

    # sort by tier: T1 first; again: descending, unknown first
    page.click("th[data-key='tier']")
    assert visible_rows(page)[0][4] == "T1"
    page.click("th[data-key='tier']")
    assert visible_rows(page)[0][4] == "unknown"
    assert page.get_attribute("th[data-key='tier']", "aria-sort") == "descending"

    # sort by bytes, largest first
    page.click("th[data-key='bytes']")
    page.click("th[data-key='bytes']")
    assert visible_rows(page)[0][5] == "1.7 GiB"

    # filter by text, then by tier and kind
    page.fill("#f-text", "kv_cache.py:")
    page.wait_for_function("document.getElementById('site-count').textContent.includes(' of ')")
    rows = visible_rows(page)
    assert page.inner_text("#site-count") == f"{len(rows)} of 47 sites" and len(rows) >= 2
    assert all("kv_cache.py:" in " ".join(row) for row in rows)
    page.fill("#f-text", "kv_cache.py KVCachePool.__init__")
    page.wait_for_function("document.getElementById('site-count').textContent.startsWith('2 of')")
    assert all(row[0].startswith("examples/minigen/kv_cache.py:") for row in visible_rows(page))
    page.fill("#f-text", "")
    page.select_option("#f-tier", "T5b")
    page.wait_for_function("document.getElementById('site-count').textContent.startsWith('3 of')")
    assert {row[4] for row in visible_rows(page)} == {"T5b"}
    page.select_option("#f-tier", "")
    page.select_option("#f-kind", "ipc")
    assert {row[3] for row in visible_rows(page)} == {"ipc"}
    page.select_option("#f-kind", "")
    page.select_option("#f-allow", "no")
    assert page.inner_text("#site-count").startswith("0 of")
    assert "No site matches" in page.inner_text("#site-rows")

    # the findings list the related locations
    text = page.inner_text("#findings")
    assert "examples/minigen/model_runner.py:82" in text and "capture starts here" in text

    # the theme switch and the dark scheme change the colours
    light_bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.click("#theme")
    dark_bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert light_bg != dark_bg
    dark_page, dark_errors, _ = open_report(browser, out, "dark")
    assert dark_errors == []
    assert dark_page.evaluate("getComputedStyle(document.body).backgroundColor") == dark_bg


def _holder(f: int, per_file: int) -> str:
    lines = ["import torch", "", ""]
    lines.append(f"class Holder{f}:")
    lines.append("    def __init__(self, n):")
    for i in range(per_file // 2):
        lines.append(f"        self.b{i} = torch.empty(n, {i + 1}, device='cuda')")
    lines += ["", "    def step(self, x):"]
    for i in range(per_file - per_file // 2):
        lines.append(f"        t{i} = torch.zeros_like(x)")
    lines.append("        return x")
    return "\n".join(lines) + "\n"


def _big_report(root: Path, files: int, per_file: int, out: Path) -> str:
    """The HTML report of ``files`` files of ``per_file`` sites each, through
    the real report model (ScanResult -> ReportContext -> report.render):
    one such file is scanned by the real pipeline, and the result holds the
    copy of its sites and findings that each of the other files would give
    (the same text with another class name, in another folder). The cold
    scan of all of them (6 s of CPU) is the scanner's cost, not the report's,
    and held elsewhere (test_fuzz, the census benches). Returns the report's
    one-line summary."""
    import dataclasses

    from alloc_audit import report
    from alloc_audit.commands.project import Options, load_project, report_context, scan_project
    from alloc_audit.commands.scan import one_line_summary

    make_repo(root, {"pkg0/mod0.py": _holder(0, per_file)})
    project = load_project([root], None)
    one = scan_project(project, [root], Options(no_cache=True))
    assert not one.errors and len(one.sites) == per_file and {s.path for s in one.sites} == {"pkg0/mod0.py"}

    def moved(text: str, f: int) -> str:
        return text.replace("pkg0/mod0.py", f"pkg{f % 20}/mod{f}.py").replace("Holder0", f"Holder{f}")

    sites = []
    findings = []
    for f in range(files):
        sites += [dataclasses.replace(s, path=moved(s.path, f), scope=moved(s.scope, f),
                                      tier_reason=moved(s.tier_reason, f)) for s in one.sites]
        findings += [dataclasses.replace(x, path=moved(x.path, f), scope=moved(x.scope, f),
                                         message=moved(x.message, f), key=moved(x.key, f)) for x in one.findings]
    result = dataclasses.replace(
        one, sites=tuple(sorted(sites, key=lambda s: s.sort_key)),
        findings=tuple(sorted(findings, key=lambda x: x.sort_key)),
        stats=dataclasses.replace(one.stats, files=files, parsed=files, lines=one.stats.lines * files),
        scanned_paths=frozenset(s.path for s in sites), files={})
    before = os.getcwd()
    os.chdir(root)  # the root shown as `alloc-audit report` run in it shows it
    try:
        text = report.render("html", report_context(project, result, Options()), "report")
    finally:
        os.chdir(before)
    out.write_text(text, encoding="utf-8")
    return one_line_summary(result)


def test_ten_thousand_sites_open_within_seconds(browser: Any, tmp_path: Path) -> None:
    out = tmp_path / "big.html"
    summary = _big_report(tmp_path / "big", files=200, per_file=52, out=out)
    assert "10400 sites" in summary and "in 200 files" in summary
    page, errors, seconds = open_report(browser, out)
    assert errors == []
    assert seconds < 8, f"10k-site report took {seconds:.1f} s to become ready"
    assert page.inner_text("#site-count") == "10400 sites"
    # virtualised: only the rows in view (plus a margin) are in the DOM
    assert len(visible_rows(page)) < 120
    # scrolling to the end renders the last rows
    page.eval_on_selector("#site-box", "b => { b.scrollTop = b.scrollHeight; b.dispatchEvent(new Event('scroll')); }")
    page.wait_for_timeout(200)
    assert any("pkg" in row[0] for row in visible_rows(page))
    started = time.perf_counter()
    page.click("th[data-key='location']")
    page.fill("#f-text", "mod199.py")
    page.wait_for_function("document.getElementById('site-count').textContent.startsWith('52 of')")
    assert time.perf_counter() - started < 3
    assert errors == []


CLIPPED_CELLS = """() => Array.from(document.querySelectorAll('#site-rows tr:not(.spacer) td')).filter(
    td => td.scrollWidth > td.clientWidth + 1 || td.scrollHeight > td.clientHeight + 1).map(td => td.textContent)"""


@pytest.mark.parametrize("width", [1280, 1920])
def test_columns_fit_their_content_at_common_widths(browser: Any, tmp_path: Path, width: int) -> None:
    """Cells wrap instead of clipping (the reason column was cut to ~12
    characters, the last column clipped), the table fits its box, and the
    findings-by-rule panel is as tall as its bars, not as the chart beside it."""
    long_reason = "kept for the whole run: " + "the decode workspace is sized from the planned maximum " * 2
    root = make_repo(tmp_path / "p", {
        "pkg/engine/very_long_module_name_for_the_model_runner.py":
            "import torch\n\n\nclass ModelRunnerWithAVeryLongName:\n"
            "    def initialize_the_persistent_buffers(self, n):\n"
            "        # alloc-audit: tier=T2 " + long_reason + "\n"
            '        self.a = torch.empty(n, device="cuda")\n',
        "pkg/ops.py": "import torch\n\n\ndef step(g, n):\n    with torch.cuda.graph(g):\n"
                      '        return torch.empty(n, device="cuda")\n',
    })
    out = tmp_path / "r.html"
    assert run_cli("report", "-o", str(out), cwd=root).code == 0
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(out.as_uri())
    page.wait_for_selector("html[data-ready='1']", timeout=20000)
    assert page.evaluate(CLIPPED_CELLS) == []
    reason_cell = page.evaluate("() => Array.from(document.querySelectorAll('#site-rows td')).map(td => "
                                "td.textContent).find(t => t.includes('kept for the whole run'))")
    assert reason_cell and reason_cell.strip().endswith("planned maximum"), "the whole reason is shown"
    fits = page.evaluate("() => { const b = document.getElementById('site-box'), t = document.getElementById("
                         "'site-table'), last = t.querySelector('thead th:last-child').getBoundingClientRect(); "
                         "return [t.scrollWidth <= b.clientWidth + 1, last.right <= b.getBoundingClientRect().right "
                         "+ 1, last.right <= window.innerWidth] }")
    assert fits == [True, True, True]
    rules = page.eval_on_selector("#chart-rules", "f => f.getBoundingClientRect().height")
    dirs = page.eval_on_selector("#chart-dirs", "f => f.getBoundingClientRect().height")
    bars = page.eval_on_selector_all("#chart-rules svg rect.bar", "n => n.length")
    assert bars == 1 and rules < 130, f"a one-bar panel is {rules:.0f} px tall"
    assert rules <= dirs + 1


def test_wrapped_rows_scroll_to_the_last_site(browser: Any, tmp_path: Path) -> None:
    """Rows of different heights: the scroller measures them, so the last
    site is reachable and rows neither overlap nor leave gaps."""
    reasons = {f"m{i}.py": "import torch\n\n\ndef f(n):\n    # alloc-audit: tier=T2 " + ("reason " * (i % 7 * 9 + 1))
               + '\n    return torch.empty(n, device="cuda")\n' for i in range(120)}
    root = make_repo(tmp_path / "p", reasons)
    out = tmp_path / "r.html"
    assert run_cli("report", "-o", str(out), cwd=root).code == 0
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(out.as_uri())
    page.wait_for_selector("html[data-ready='1']", timeout=20000)
    page.click("th[data-key='location']")
    for _ in range(4):  # heights become known as rows are drawn; scroll to the bottom until it settles
        page.eval_on_selector("#site-box", "b => { b.scrollTop = b.scrollHeight; b.dispatchEvent(new Event('scroll')); }")
        page.wait_for_timeout(150)
    assert visible_rows(page)[-1][0] == "m99.py:6"
    gaps = page.evaluate("() => { const r = Array.from(document.querySelectorAll('#site-rows tr:not(.spacer)'))"
                         ".map(t => t.getBoundingClientRect()); return r.slice(1).map((b, i) => "
                         "Math.round(b.top - r[i].bottom)).filter(g => g !== 0) }")
    assert gaps == []
    assert page.evaluate(CLIPPED_CELLS) == []
