"""Discovery and bad input, through the CLI: .gitignore (with and without
git), include/exclude, symlinks, the size limit, binary and non-UTF-8 files.
A file that cannot be analysed is reported by name and the run goes on."""

from __future__ import annotations

import json
import os
from pathlib import Path

from clihelp import make_repo, run_cli, write

SITE = 'import torch\n\n\ndef f(n):\n    return torch.empty(n, device="cuda")\n'


def scan(root: Path, *args: str) -> dict:
    result = run_cli("scan", "--format", "json", "--no-cache", *args, cwd=root)
    assert result.code == 0, result.err
    return json.loads(result.out)


def paths(doc: dict) -> set[str]:
    return {s["path"] for s in doc["sites"]}


def test_gitignore_in_a_git_repository(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"src/a.py": SITE, ".gitignore": "build/\n*_gen.py\n"})
    write(root, "build/b.py", SITE)
    write(root, "src/c_gen.py", SITE)
    write(root, "src/untracked.py", SITE)  # untracked but not ignored: scanned
    assert paths(scan(root)) == {"src/a.py", "src/untracked.py"}


def test_gitignore_without_git_nested_and_vendored_dirs(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    write(root, "alloc-audit.toml", "# no git here\n")
    write(root, ".gitignore", "generated/\n")
    write(root, "src/a.py", SITE)
    write(root, "generated/x.py", SITE)
    write(root, "src/deep/.gitignore", "skip_me.py\n")
    write(root, "src/deep/skip_me.py", SITE)
    write(root, "src/deep/keep.cu", '#include <cuda_runtime.h>\nvoid f(void** p) { cudaMalloc(p, 64); }\n')
    write(root, "node_modules/m.py", SITE)
    assert paths(scan(root)) == {"src/a.py", "src/deep/keep.cu"}


def test_include_and_exclude_globs(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"eng/a.py": SITE, "eng/tests/t.py": SITE, "tools/x.py": SITE},
                     config='include = ["eng/**"]\nexclude = ["**/tests/**"]\n')
    assert paths(scan(root)) == {"eng/a.py"}


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"src/a.py": SITE})
    os.symlink(root / "src" / "a.py", root / "src" / "link.py")
    os.symlink(root / "src", root / "src" / "loop")
    os.symlink(tmp_path / "nowhere.py", root / "src" / "dangling.py")
    doc = scan(root)
    assert paths(doc) == {"src/a.py"}
    assert doc["errors"] == []


def test_size_limit_reports_the_file_and_goes_on(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"src/a.py": SITE}, config="max-file-size = 2000\n")
    write(root, "src/huge.py", SITE + "x = 1\n" * 1000)
    doc = scan(root)
    assert paths(doc) == {"src/a.py"}
    assert doc["errors"] == [{"path": "src/huge.py", "message":
                              "larger than the 2,000 bytes limit (6,066 bytes); skipped (raise max-file-size to scan it)",
                              "analysed": False}]


def test_binary_and_non_utf8_files(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"src/a.py": SITE})
    (root / "src" / "blob.py").write_bytes(b"\x00\x01torch.empty(\x00" * 100)
    (root / "src" / "latin1.py").write_bytes(
        b"# caf\xe9\nimport torch\n\n\ndef g(n):\n    return torch.zeros(n, device='cuda')\n")
    doc = scan(root)
    assert paths(doc) == {"src/a.py", "src/latin1.py"}
    assert doc["errors"] == [{"path": "src/blob.py", "message": "binary content (a NUL byte in the first 8 KiB); skipped",
                              "analysed": False},
                             {"path": "src/latin1.py", "message":
                              "not valid UTF-8 (byte 0xe9 at line 1); read as bytes, texts may show replacement "
                              "characters", "analysed": True}]


def test_a_file_that_fails_to_parse_is_reported_and_the_rest_scanned(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", {"src/a.py": SITE})
    write(root, "src/broken.py", "import torch\n\ndef f(n:\n    return torch.empty(n, device='cuda')\n\n"
                                 "def g(n):\n    return torch.ones(n, device='cuda')\n")
    write(root, "src/broken.cu", "void f(void** p) { cudaMalloc(p, 64); \n")
    doc = scan(root)
    assert {"src/a.py", "src/broken.py"} <= paths(doc)
    reported = {e["path"] for e in doc["errors"]}
    assert {"src/broken.py", "src/broken.cu"} <= reported
    messages = {e["path"]: e["message"] for e in doc["errors"]}
    assert messages["src/broken.py"].startswith("syntax error at line 3, column 1 (python grammar)")
    assert messages["src/broken.cu"].startswith("missing token at line 1, column 38 (cuda grammar)")


_GI_LINES = ("*.py", "!keep.py", "build/", "/top.cu", "**/gen/**", "a/**/b", "*.o", "# note", "", "\\#x", "!dir/",
             "dir/", "x?.h", "[ab]*.cpp", "foo/bar", "!foo/bar/baz.py", "(?P<x>", "*.cu ", "\\!bang", "docs", "!*.md")
_GI_PARTS = ("a", "b", "gen", "build", "dir", "foo", "bar", "docs", "src", "keep.py", "x1.h", "top.cu", "m.py",
             "baz.py", "a.cpp", "c.o", "#x", "!bang", "(?P<x>", "r.md")


def test_gitignore_any_pattern_search_agrees_with_the_spec() -> None:
    """perf-r29: ``discover.GitIgnore`` answers no at once when no pattern matches; it must say what the
    spec says for every path (generated .gitignores: negations, directories, anchors, globs, escapes)."""
    import random

    import pathspec

    from alloc_audit.pipeline.discover import GitIgnore
    rng = random.Random(29)
    for _ in range(300):
        lines = [rng.choice(_GI_LINES) for _ in range(rng.randint(0, 8))]
        spec = pathspec.GitIgnoreSpec.from_lines(lines)
        quick = GitIgnore(spec)
        for _ in range(40):
            path = "/".join(rng.choice(_GI_PARTS) for _ in range(rng.randint(1, 4))) + rng.choice(("", "/"))
            assert quick.match_file(path) == spec.match_file(path), (lines, path)
