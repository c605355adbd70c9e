"""`alloc-audit report` through the installed CLI: golden files for the
byte-stable formats (Markdown, SARIF, GitHub), SARIF validity against the
official schema, the terminal report at 80 and 160 columns and piped, the
`--base` delta in a real git repository, `--bind` and `--output`.

Regenerate the golden files after an intended change with
``ALLOC_AUDIT_UPDATE_GOLDEN=1 pytest tests/test_report.py``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import jsonschema
import pytest
from clihelp import git, make_repo, run_cli, write

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"
SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
ANSI = re.compile(r"\x1b\[")


def check_golden(name: str, text: str) -> None:
    """The tool's version is written as X.Y.Z in golden files, so a release
    bump does not rewrite them."""
    from alloc_audit import __version__

    text = text.replace(f'"{__version__}"', '"X.Y.Z"').replace(f"alloc-audit {__version__} ", "alloc-audit X.Y.Z ")
    path = GOLDEN / name
    if os.environ.get("ALLOC_AUDIT_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; run with ALLOC_AUDIT_UPDATE_GOLDEN=1"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} differs from the golden file; if intended, regenerate it"


def validate_sarif(doc: dict) -> None:
    validator = jsonschema.Draft4Validator(SARIF_SCHEMA, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])


# ---------------------------------------------------------------- golden files on the demo


@pytest.mark.parametrize("fmt,name", [("markdown", "examples.md"), ("sarif", "examples.sarif"),
                                      ("github", "examples.github.txt")])
def test_golden_demo_report(fmt: str, name: str) -> None:
    first = run_cli("report", "examples", "--format", fmt, "--jobs", "1", cwd=REPO)
    assert first.code == 0, first.err
    second = run_cli("report", "examples", "--format", fmt, "--jobs", "2", "--no-cache", cwd=REPO)
    assert first.out == second.out, "output depends on the number of jobs or on the cache"
    check_golden(name, first.out)


def test_golden_demo_scan_json() -> None:
    """The JSON of `scan` on the demo, wall-clock seconds left out (the only
    value that differs between runs)."""
    result = run_cli("scan", "examples", "--format", "json", "--no-cache", "--jobs", "1", cwd=REPO)
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert isinstance(doc["stats"].pop("seconds"), float)
    check_golden("examples.scan.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")


def test_demo_sarif_is_valid_and_complete() -> None:
    result = run_cli("report", "examples", "--format", "sarif", cwd=REPO)
    doc = json.loads(result.out)
    validate_sarif(doc)
    run = doc["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    for rule in rules.values():
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["markdown"] and rule["help"]["text"]
    # every rule `rules list` shows is described
    listed = {line.split()[0] for line in run_cli("rules", "list", cwd=REPO).out.splitlines() if line.strip()}
    assert listed <= set(rules)
    by_rule: dict[str, list[dict]] = {}
    for res in run["results"]:
        assert run["tool"]["driver"]["rules"][res["ruleIndex"]]["id"] == res["ruleId"]
        by_rule.setdefault(res["ruleId"], []).append(res)
        assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("examples/")
    snapshot = by_rule["snapshot-before-construction"][0]
    assert len(snapshot["relatedLocations"]) >= 2
    assert all(r["message"]["text"] for r in snapshot["relatedLocations"])
    fingerprints = [r["partialFingerprints"]["allocAudit/v1"] for r in run["results"]]
    assert len(fingerprints) == len(set(fingerprints))
    assert run["invocations"][0]["toolExecutionNotifications"][0]["locations"][0]["physicalLocation"][
        "artifactLocation"]["uri"] == "examples/minigen/experimental/draft.py"


HAZARD = '''
import torch


def capture(graph, n):
    with torch.cuda.graph(graph):
        out = torch.empty(n, device="cuda")
        tmp = torch.empty(n, device="cuda")  # alloc-audit: ignore[alloc-in-capture] sized once, replayed as is
    return out, tmp
'''


def test_sarif_fingerprints_follow_a_finding_across_line_moves(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"eng/cap.py": HAZARD})

    def results() -> list[dict]:
        doc = json.loads(run_cli("report", "--format", "sarif", cwd=root).out)
        validate_sarif(doc)
        return doc["runs"][0]["results"]

    before = results()
    write(root, "eng/cap.py", "# a comment\n\n\n" + HAZARD.lstrip("\n"))
    after = results()
    key = lambda r: (r["ruleId"], r["partialFingerprints"]["allocAudit/v1"])  # noqa: E731
    assert sorted(map(key, before)) == sorted(map(key, after))
    lines = lambda rs: sorted(r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in rs)  # noqa: E731
    assert [n + 3 for n in lines(before)] == lines(after)
    suppressed = [r for r in after if r.get("suppressions")]
    assert len(suppressed) == 1
    assert suppressed[0]["suppressions"][0] == {"kind": "inSource", "status": "accepted",
                                                "justification": "sized once, replayed as is"}


def test_sarif_uris_are_relative_to_the_repository_root(tmp_path: Path) -> None:
    repo = tmp_path / "mono"
    make_repo(repo, {"engine/eng/cap.py": HAZARD})
    write(repo, "engine/alloc-audit.toml", "# the engine is its own project\n")
    doc = json.loads(run_cli("report", "--format", "sarif", cwd=repo / "engine").out)
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in doc["runs"][0]["results"]}
    assert uris == {"engine/eng/cap.py"}


# ---------------------------------------------------------------- the terminal report


@pytest.mark.parametrize("width", [80, 160])
def test_terminal_report_fits_the_width_and_has_no_escape_codes_when_piped(width: int) -> None:
    result = run_cli("report", "examples", cwd=REPO, env={"COLUMNS": str(width)})
    assert result.code == 0, result.err
    assert not ANSI.search(result.out)
    lines = result.out.splitlines()
    assert max(len(line) for line in lines) <= width
    assert not any(line != line.rstrip() for line in lines), "trailing whitespace in piped output"
    text = result.out
    for heading in ("Sites by tier", "Sites by directory", "Hazards", "Allowlist", "Next"):
        assert heading in text
    assert "alloc-in-capture 6 in 3 files" in text
    assert "↳ examples/minigen/csrc/allocator.cu:113 capture starts here" in text
    assert "Allowlist clean: 40 entries" in text
    # sizes come from the demo's [tool.alloc-audit.bindings]
    assert re.search(r"T1 model-resident\s+│\s+2 │\s+│\s+1\.9 GiB", text), text


@pytest.mark.parametrize("by,expect", [
    ("dir", "Sites by directory (5 directories)"),
    ("file", "examples/minigen/csrc/allocator.cu"),
    ("tier", "T4 forward-scratch"),
    ("rule", "Findings by rule"),
    ("api", "cudaMalloc"),
])
def test_report_pivots(by: str, expect: str) -> None:
    result = run_cli("report", "examples", "--by", by, cwd=REPO)
    assert result.code == 0 and expect in result.out, result.out + result.err


def test_wide_terminal_has_one_column_per_tier_narrow_a_tier_mix() -> None:
    wide = run_cli("report", "examples", "--by", "file", cwd=REPO, env={"COLUMNS": "160"}).out
    narrow = run_cli("report", "examples", "--by", "file", cwd=REPO, env={"COLUMNS": "80"}).out
    assert re.search(r"file\s+┃ sites ┃ T1 ┃ T2 ┃", wide)
    assert re.search(r"file\s+┃ sites ┃ tiers\s+┃", narrow)
    assert re.search(r"│\s+12 │ T1 2 · T2 4 ·", narrow)


def test_colour_only_when_forced() -> None:
    coloured = run_cli("report", "examples", cwd=REPO, env={"NO_COLOR": "", "FORCE_COLOR": "1"})
    assert ANSI.search(coloured.out)


def test_bind_adds_to_the_configured_bindings_and_rejects_junk(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"eng/buf.py": '''
        import torch


        class Runner:
            def __init__(self, config):
                self.embeds = torch.empty((config.max_num_tokens, config.hidden_size), dtype=torch.bfloat16,
                                          device="cuda")
        '''}, config="[bindings]\nhidden_size = 6144\n")
    without = run_cli("report", "-f", "json", cwd=root)
    assert json.loads(without.out)["sites"][0]["bytes"] is None
    bound = run_cli("report", "--bind", "max_num_tokens=3072", "-f", "json", cwd=root)
    assert json.loads(bound.out)["sites"][0]["bytes"] == 3072 * 6144 * 2
    table = run_cli("report", "--bind", "max_num_tokens=3_072", cwd=root).out
    assert "36.0 MiB" in table
    bad = run_cli("report", "--bind", "max_num_tokens=lots", cwd=root)
    assert bad.code == 2 and "--bind: max_num_tokens: 'lots' is not an integer" in bad.err
    bad_config = make_repo(tmp_path / "q", {"a.py": "x = 1\n"}, config="[bindings]\nhidden = 'big'\n")
    res = run_cli("report", cwd=bad_config)
    assert res.code == 2 and "alloc-audit.toml:2" in res.err and "'hidden' must be an integer" in res.err


def test_output_file_gets_the_report_and_the_terminal_one_line(tmp_path: Path) -> None:
    for fmt in ("markdown", "html", "sarif", "github", "json", "table"):
        out = tmp_path / f"report.{fmt}"
        result = run_cli("report", "examples", "-f", fmt, "-o", str(out), cwd=REPO)
        assert result.code == 0, result.err
        assert result.out.count("\n") == 1 and f"report written to {out}" in result.out
        assert out.read_text(encoding="utf-8").strip()
    missing = run_cli("report", "examples", "-o", str(tmp_path / "no" / "such" / "dir" / "r.md"), cwd=REPO)
    assert missing.code == 2 and "cannot write report" in missing.err


def test_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    import pty
    import select
    import subprocess

    from clihelp import cli_command

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm", "ALLOC_AUDIT_PROGRESS_DELAY": "0"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([*cli_command(), "report", "examples", "--no-cache", "--jobs", "1"], cwd=REPO,
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 30)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(30)
    os.close(master)
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert "scanning" in shown and proc.returncode == 0
    piped = run_cli("report", "examples", "--no-cache", "--jobs", "1", cwd=REPO,
                    env={"ALLOC_AUDIT_PROGRESS_DELAY": "0"})
    assert "scanning" not in piped.out + piped.err


# ---------------------------------------------------------------- --base: the delta in a real repository


BASE = {
    "eng/runner.py": '''
        import torch


        class Runner:
            def __init__(self, n):
                self.keep = torch.empty(n, device="cuda")

            def step(self, graph, n):
                with torch.cuda.graph(graph):
                    return torch.empty(n, device="cuda")
        ''',
}


def test_markdown_delta_against_a_base_ref(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", BASE)
    # a new persistent buffer and a new scratch allocation under capture; the old capture hazard fixed
    write(root, "eng/runner.py", '''
        import torch


        class Runner:
            def __init__(self, n):
                self.keep = torch.empty(n, device="cuda")
                self.more = torch.zeros(n, device="cuda")
                self.out = torch.empty(n, device="cuda")

            def step(self, graph, n):
                with torch.cuda.graph(graph):
                    return self.out

            def other(self, graph, n):
                with torch.cuda.graph(graph):
                    return torch.ones(n, device="cuda")
        ''')
    git(root, "commit", "-qam", "change")
    result = run_cli("report", "--format", "markdown", "--base", "HEAD~1", cwd=root)
    assert result.code == 0, result.err
    text = result.out
    assert "### Change against `HEAD~1`" in text
    assert "| T2 engine-persistent | +2 |  |" in text
    assert "| T4 forward-scratch | +1 | −1 |" in text
    assert "Findings: **1 new**, 1 fixed." in text
    assert "<summary>Added sites (3)</summary>" in text and "`eng/runner.py:8`" in text
    assert "<summary>New findings (1)</summary>" in text and "`eng/runner.py:16` `alloc-in-capture`" in text
    # the work tree was not touched, and the base scan did not leave files behind
    assert git(root, "status", "--porcelain") == ""
    same = run_cli("report", "--format", "markdown", "--base", "HEAD", cwd=root)
    assert "No sites added or removed, no findings new or fixed." in same.out


def test_base_ref_that_does_not_exist_is_a_clear_error(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", BASE)
    result = run_cli("report", "--format", "markdown", "--base", "origin/nope", cwd=root)
    assert result.code == 2 and "git ref 'origin/nope' is not available here" in result.err


# ---------------------------------------------------------------- HTML, without a browser


def test_html_is_self_contained_and_carries_every_site() -> None:
    result = run_cli("report", "examples", "-f", "html", cwd=REPO)
    html = result.out
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html), "external resource"
    assert "@import" not in html and "url(" not in html
    assert html.count("<svg") == 2 and 'class="bar t-T2"' in html and 'class="bar s-error"' in html
    assert "prefers-color-scheme: dark" in html
    data = json.loads(re.search(r'<script type="application/json" id="alloc-data">(.*?)</script>', html, re.S)
                      .group(1).replace("<\\/", "</"))
    scan = json.loads(run_cli("scan", "examples", "-f", "json", cwd=REPO).out)
    assert len(data["sites"]) == sum(1 for s in scan["sites"] if s["kind"] != "release")
