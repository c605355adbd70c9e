"""The allowlist ratchet on real git repositories, through the installed CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from clihelp import git, make_repo, run_cli, write

RUNNER = '''
import torch


class Runner:
    def __init__(self, n):
        self.a = torch.zeros(n, device="cuda")
        self.b = torch.zeros(n, device="cuda")

    def step(self, n):
        return torch.empty(n, device="cuda").sum()
'''

MOVED = '''
import torch


class Runner:
    def step(self, n):
        return torch.empty(
            n,
            device="cuda",
        ).sum()



    def __init__(self, n):
        # buffers for the inputs
        self.a = torch.zeros(n,
                             device="cuda")
        self.b = torch.zeros(n, device="cuda")
'''


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = make_repo(tmp_path / "proj", {"eng/runner.py": RUNNER})
    result = run_cli("allowlist", "init", cwd=root)
    assert result.code == 0, result.err
    git(root, "add", "-A")
    git(root, "commit", "-qm", "allowlist")
    return root


def entries(root: Path) -> list[str]:
    text = (root / "allowlists" / "alloc-audit.allowlist").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_init_writes_sorted_entries_without_line_numbers(repo: Path) -> None:
    assert entries(repo) == [
        "eng/runner.py Runner.__init__ torch.zeros x2 T2",
        "eng/runner.py Runner.step torch.empty T4",
    ]


def test_init_refuses_to_overwrite(repo: Path) -> None:
    result = run_cli("allowlist", "init", cwd=repo)
    assert result.code == 2
    assert "already exists" in result.err


def test_moving_reformatting_and_blank_lines_change_nothing(repo: Path) -> None:
    write(repo, "eng/runner.py", MOVED)
    result = run_cli("check", cwd=repo)
    assert result.code == 0, result.out + result.err


def test_a_new_site_in_the_same_function_fails(repo: Path) -> None:
    write(repo, "eng/runner.py", RUNNER.replace(
        '        self.b = torch.zeros(n, device="cuda")',
        '        self.b = torch.zeros(n, device="cuda")\n        self.c = torch.zeros(n, device="cuda")'))
    result = run_cli("check", cwd=repo)
    assert result.code == 1
    # without line numbers in keys, which of the three is new cannot be told: all are named
    assert "eng/runner.py:6: error: allowlist entry grew: torch.zeros in Runner.__init__: the allowlist " \
           "accepts 2, the code has 3 (lines 6, 7, 8)" in result.out


def test_a_new_scope_fails_as_a_new_site(repo: Path) -> None:
    write(repo, "eng/runner.py", RUNNER + '''
    def warmup(self, n):
        return torch.ones(n, device="cuda")
''')
    result = run_cli("check", cwd=repo)
    assert result.code == 1
    assert "new allocation site" in result.out and "Runner.warmup" in result.out


def test_removed_site_leaves_a_stale_entry_and_update_prunes_it_keeping_reasons(repo: Path) -> None:
    allowlist = repo / "allowlists" / "alloc-audit.allowlist"
    allowlist.write_text(allowlist.read_text().replace(
        "torch.zeros x2 T2", "torch.zeros x2 T2 # inputs, counted in the budget"))
    write(repo, "eng/runner.py", RUNNER.replace(
        '    def step(self, n):\n        return torch.empty(n, device="cuda").sum()\n', ''))
    result = run_cli("check", cwd=repo)
    assert result.code == 1
    assert "stale allowlist entry" in result.out and "delete it" in result.out
    update = run_cli("allowlist", "update", cwd=repo)
    assert update.code == 0, update.err
    assert "- removed  eng/runner.py Runner.step torch.empty" in update.out
    assert entries(repo) == ["eng/runner.py Runner.__init__ torch.zeros x2 T2 # inputs, counted in the budget"]
    assert run_cli("check", cwd=repo).code == 0
    assert run_cli("allowlist", "update", cwd=repo).out.strip().endswith("up to date")


def test_a_fixed_site_leaves_a_loose_count(repo: Path) -> None:
    write(repo, "eng/runner.py", RUNNER.replace('        self.b = torch.zeros(n, device="cuda")\n', ""))
    result = run_cli("check", cwd=repo)
    assert result.code == 1
    assert "accepts 2 but only 1 remain" in result.out
    assert "- lowered  eng/runner.py Runner.__init__ torch.zeros x2 -> x1" in run_cli("allowlist", "update",
                                                                                       cwd=repo).out


def test_gate_fails_on_growth_and_passes_on_shrinking(repo: Path) -> None:
    write(repo, "eng/runner.py", RUNNER + '''
    def warmup(self, n):
        return torch.ones(n, device="cuda")
''')
    assert run_cli("allowlist", "update", "--add-new", cwd=repo).code == 0
    git(repo, "commit", "-qam", "grow")
    grown = run_cli("gate", "--base", "HEAD~1", cwd=repo)
    assert grown.code == 1
    assert "allowlist grew: eng/runner.py Runner.warmup torch.ones added (no reason given); needed by line 13" \
           in grown.out
    allowed = run_cli("gate", "--base", "HEAD~1", "--allow-growth", cwd=repo)
    assert allowed.code == 0 and "let through by --allow-growth" in allowed.out
    write(repo, "eng/runner.py", RUNNER.replace('        self.b = torch.zeros(n, device="cuda")\n', ""))
    assert run_cli("allowlist", "update", cwd=repo).code == 0
    git(repo, "commit", "-qam", "shrink")
    shrunk = run_cli("gate", "--base", "HEAD~1", cwd=repo)
    assert shrunk.code == 0, shrunk.out + shrunk.err
    assert "0 grown" in shrunk.out


def test_gate_on_first_introduction(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"eng/runner.py": RUNNER})
    assert run_cli("allowlist", "init", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "introduce")
    refused = run_cli("gate", "--base", "HEAD~1", cwd=root)
    assert refused.code == 1 and "--allow-new-allowlist" in refused.err
    assert run_cli("gate", "--base", "HEAD~1", "--allow-new-allowlist", cwd=root).code == 0


def test_gate_names_what_to_fetch_when_the_ref_is_missing(repo: Path) -> None:
    result = run_cli("gate", "--base", "origin/main", cwd=repo)
    assert result.code == 2
    assert "git ref 'origin/main' is not available here" in result.err and "git fetch" in result.err


def test_gate_in_a_shallow_clone(repo: Path, tmp_path: Path) -> None:
    write(repo, "eng/runner.py", RUNNER.replace('        self.b = torch.zeros(n, device="cuda")\n', ""))
    assert run_cli("allowlist", "update", cwd=repo).code == 0
    git(repo, "commit", "-qam", "shrink")
    clone = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(clone))
    missing = run_cli("gate", "--base", "HEAD~1", cwd=clone)
    assert missing.code == 2 and "shallow clone" in missing.err
    git(clone, "fetch", "-q", "--deepen", "1")
    assert run_cli("gate", "--base", "HEAD~1", cwd=clone).code == 0


def test_renamed_file_moves_its_entries_and_keeps_the_reason(repo: Path) -> None:
    allowlist = repo / "allowlists" / "alloc-audit.allowlist"
    allowlist.write_text(allowlist.read_text().replace("torch.empty T4", "torch.empty T4 # per-step scratch"))
    git(repo, "commit", "-qam", "reason")
    git(repo, "mv", "eng/runner.py", "eng/model_runner.py")
    assert run_cli("check", cwd=repo).code == 1  # the old entries are stale, the new sites new
    update = run_cli("allowlist", "update", cwd=repo)
    assert "> renamed  eng/runner.py -> eng/model_runner.py (2 entries, reasons kept)" in update.out
    assert "eng/model_runner.py Runner.step torch.empty T4 # per-step scratch" in entries(repo)
    git(repo, "commit", "-qam", "rename")
    gate = run_cli("gate", "--base", "HEAD~1", cwd=repo)
    assert gate.code == 0, gate.out
    assert "2 moved" in gate.out


THREE = RUNNER + '''
    def warmup(self, n):
        return torch.ones(n, device="cuda")
'''


def test_branches_removing_different_entries_merge_without_conflict(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"eng/runner.py": THREE})
    run_cli("allowlist", "init", cwd=root)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "allowlist")
    git(root, "checkout", "-q", "-b", "left")
    write(root, "eng/runner.py", THREE.replace(
        '        self.a = torch.zeros(n, device="cuda")\n        self.b = torch.zeros(n, device="cuda")\n',
        "        self.a = self.b = None\n"))
    run_cli("allowlist", "update", cwd=root)
    git(root, "commit", "-qam", "left: no input buffers")
    git(root, "checkout", "-q", "main")
    git(root, "checkout", "-q", "-b", "right")
    write(root, "eng/runner.py", THREE.replace(
        '    def warmup(self, n):\n        return torch.ones(n, device="cuda")\n', ''))
    run_cli("allowlist", "update", cwd=root)
    git(root, "commit", "-qam", "right: no warm-up buffer")
    git(root, "merge", "-q", "--no-edit", "left")  # sorted, one entry per line: no conflict
    assert entries(root) == ["eng/runner.py Runner.step torch.empty T4"]
    assert run_cli("check", cwd=root).code == 0


def test_merge_driver_resolves_conflicts_fail_closed(repo: Path) -> None:
    git(repo, "config", "merge.alloc-audit.driver", " ".join(
        [*__import__("clihelp").cli_command(), "allowlist", "merge-driver", "%O", "%A", "%B"]))
    write(repo, ".gitattributes", "allowlists/*.allowlist merge=alloc-audit\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "merge driver")
    path = repo / "allowlists" / "alloc-audit.allowlist"
    git(repo, "checkout", "-q", "-b", "a")
    path.write_text(path.read_text().replace("torch.zeros x2 T2", "torch.zeros x2 T2 # reason from a"))
    git(repo, "commit", "-qam", "a: reason")
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-q", "-b", "b")
    text = path.read_text().replace("torch.zeros x2 T2", "torch.zeros T2")
    text = "\n".join(line for line in text.splitlines() if "Runner.step" not in line) + "\n"
    path.write_text(text)
    git(repo, "commit", "-qam", "b: lower and delete")
    git(repo, "merge", "-q", "--no-edit", "a")
    assert entries(repo) == ["eng/runner.py Runner.__init__ torch.zeros T2 # reason from a"]


def test_malformed_allowlist_is_an_error_and_is_never_rewritten(repo: Path) -> None:
    path = repo / "allowlists" / "alloc-audit.allowlist"
    bad = path.read_text() + "eng/runner.py Runner.step torch.empty T9\n"
    path.write_text(bad)
    for args in (("check",), ("allowlist", "update"), ("allowlist", "update", "--add-new")):
        result = run_cli(*args, cwd=repo)
        assert result.code == 2
        assert "allowlists/alloc-audit.allowlist:7: unknown tier 'T9'" in result.err
        assert path.read_text() == bad


def test_duplicate_keys_are_an_error(repo: Path) -> None:
    path = repo / "allowlists" / "alloc-audit.allowlist"
    path.write_text(path.read_text() + "eng/runner.py Runner.step torch.empty T4\n")
    result = run_cli("check", cwd=repo)
    assert result.code == 2 and "duplicate entry" in result.err


def test_explain_by_location_and_by_key(repo: Path) -> None:
    by_line = run_cli("allowlist", "explain", "eng/runner.py:6", cwd=repo)
    assert by_line.code == 0, by_line.err
    assert "covered by allowlists/alloc-audit.allowlist:5: eng/runner.py Runner.__init__ torch.zeros x2 T2" \
           in by_line.out
    by_key = run_cli("allowlist", "explain", "eng/runner.py Runner.__init__ torch.zeros", cwd=repo)
    assert "eng/runner.py:6" in by_key.out and "eng/runner.py:7" in by_key.out


def test_check_with_paths_only_judges_those_files(repo: Path) -> None:
    write(repo, "eng/other.py", 'import torch\n\n\ndef f(n):\n    return torch.empty(n, device="cuda")\n')
    assert run_cli("check", cwd=repo).code == 1
    assert run_cli("check", "eng/runner.py", cwd=repo).code == 0
    assert run_cli("check", "eng/other.py", cwd=repo).code == 1


def test_split_allowlists_keep_entries_in_their_files(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"eng/runner.py": RUNNER, "ops/k.py": 'import torch\n\n\ndef k(n):\n'
                                      '    return torch.empty(n, device="cuda")\n'})
    assert run_cli("allowlist", "init", "--split-by-directory", cwd=root).code == 0
    names = sorted(p.name for p in (root / "allowlists").iterdir())
    assert names == ["alloc-audit.findings", "eng.allowlist", "ops.allowlist"]  # the baseline: one file beside
    write(root, "ops/k2.py", 'import torch\n\n\ndef k2(n):\n    return torch.zeros(n, device="cuda")\n')
    assert run_cli("allowlist", "update", "--add-new", cwd=root).code == 0
    assert "ops/k2.py k2 torch.zeros T4" in (root / "allowlists" / "ops.allowlist").read_text()


def test_checking_staged_files_keeps_derived_sites_whose_factory_is_elsewhere(tmp_path: Path) -> None:
    """The pre-commit path sees only the staged files: a derived site (a call
    to a factory defined in another file) is invisible there, and its entry
    must not be called stale; growth is still caught."""
    root = make_repo(tmp_path / "p", {
        "eng/buffers.py": '''
            import torch


            class Staging:
                def __init__(self, n):
                    self.buf = torch.empty(n, device="cuda")
            ''',
        "eng/runner.py": '''
            from eng.buffers import Staging


            class Runner:
                def __init__(self, n):
                    self.staging = Staging(n)
            ''',
    })
    assert run_cli("allowlist", "init", cwd=root).code == 0
    assert "eng/runner.py Runner.__init__ Staging T2" in (root / "allowlists" / "alloc-audit.allowlist").read_text()
    staged = run_cli("check", "eng/runner.py", cwd=root)
    assert staged.code == 0, staged.out + staged.err
    # the whole tree still judges the derived entry: remove the call and it is stale
    write(root, "eng/runner.py", "class Runner:\n    def __init__(self, n):\n        self.staging = None\n")
    full = run_cli("check", cwd=root)
    assert full.code == 1 and "stale allowlist entry" in full.out + full.err
