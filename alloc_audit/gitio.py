"""The git plumbing the CLI needs, read-only: files changed since a ref, a
file's content at a ref (no checkout), whether a ref exists. Errors become
``UsageError`` with what to do (e.g. which ref to fetch in a shallow clone)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .errors import UsageError


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(["git", "-c", "core.quotepath=off", *args], cwd=root, capture_output=True, check=False)
    except OSError as exc:
        raise UsageError(f"cannot run git: {exc.strerror}") from None
    if check and proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip()
        raise UsageError(f"git {' '.join(args)} failed: {message}")
    return proc


def toplevel(root: Path) -> Path:
    proc = _git(root, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        raise UsageError(f"{root} is not inside a git work tree")
    return Path(proc.stdout.decode().strip())


def require_ref(root: Path, ref: str) -> str:
    """The commit ``ref`` names; a clear error when it is not available:
    outside a git repository, a ref that reaches back past the history here
    (``HEAD~999``), or a ref that must be fetched first."""
    inside = _git(root, "rev-parse", "--is-inside-work-tree", check=False)
    if inside.returncode != 0 or inside.stdout.decode().strip() != "true":
        raise UsageError(f"{root} is not inside a git repository, and a ref like '{ref}' is read through git; "
                         "run alloc-audit in a clone of the project")
    proc = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if proc.returncode == 0:
        return proc.stdout.decode().strip()
    shallow = _git(root, "rev-parse", "--is-shallow-repository", check=False).stdout.decode().strip() == "true"
    relative = re.fullmatch(r"(.+?)((?:[~^]\d*)+)", ref)
    if relative and _git(root, "rev-parse", "--verify", "--quiet", f"{relative.group(1)}^{{commit}}",
                         check=False).returncode == 0:
        depth = _git(root, "rev-list", "--count", relative.group(1), check=False).stdout.decode().strip()
        more = ("this is a shallow clone: fetch more history (`git fetch --deepen=N`, or fetch-depth: 0 in "
                "actions/checkout)" if shallow else "pick a ref within it")
        commits = f"{depth} commit" + ("" if depth == "1" else "s")
        raise UsageError(f"git ref '{ref}' goes back further than the history here ({relative.group(1)} has "
                         f"{commits}); {more}")
    hint = (
        f"this is a shallow clone; fetch the base first, e.g. `git fetch --depth=1 origin {_branch_hint(ref)}` "
        "(in GitHub Actions: actions/checkout with fetch-depth: 0, or fetch the base ref)"
        if shallow
        else f"if it is a branch or tag of a remote, fetch it first, e.g. `git fetch origin {_branch_hint(ref)}`"
    )
    raise UsageError(f"git ref '{ref}' is not available here; {hint}")


def _branch_hint(ref: str) -> str:
    return ref.split("/", 1)[1] if ref.startswith("origin/") else ref


def show(root: Path, ref: str, path: str) -> bytes | None:
    """Content of ``path`` (relative to ``root``) at ``ref``; None if absent."""
    top = toplevel(root)
    rel = (root.resolve() / path).relative_to(top.resolve()).as_posix()
    proc = _git(root, "cat-file", "blob", f"{ref}:{rel}", check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout


def list_tree(root: Path, ref: str, directory: str) -> list[str]:
    """Files under ``directory`` (relative to ``root``) at ``ref``, relative to ``root``."""
    top = toplevel(root)
    base = (root.resolve() / directory).relative_to(top.resolve()).as_posix()
    proc = _git(root, "ls-tree", "-r", "--name-only", "-z", ref, "--", base, check=False)
    if proc.returncode != 0:
        return []
    prefix = root.resolve().relative_to(top.resolve()).as_posix()
    out = []
    for entry in proc.stdout.split(b"\0"):
        if not entry:
            continue
        name = entry.decode("utf-8", "surrogateescape")
        out.append(name[len(prefix) + 1:] if prefix not in ("", ".") else name)
    return sorted(out)


def changed_since(root: Path, ref: str) -> frozenset[str]:
    """Paths (relative to ``root``) that differ between ``ref`` and the work
    tree: committed since, staged, unstaged, and untracked files."""
    require_ref(root, ref)
    diff = _git(root, "diff", "--name-only", "-z", "--relative", ref, "--")
    untracked = _git(root, "ls-files", "-z", "--others", "--exclude-standard")
    names = {p.decode("utf-8", "surrogateescape") for p in (diff.stdout + b"\0" + untracked.stdout).split(b"\0") if p}
    return frozenset(names)


def export_tree(root: Path, ref: str, dest: Path) -> Path:
    """Write the files of ``root`` as they are at ``ref`` under ``dest`` (no
    checkout, the work tree is untouched); returns the directory that
    corresponds to ``root``."""
    import io
    import tarfile

    commit = require_ref(root, ref)
    top = toplevel(root)
    rel = root.resolve().relative_to(top.resolve()).as_posix()
    args = ["archive", "--format=tar", commit]
    if rel not in ("", "."):
        args += ["--", rel]
    proc = _git(root, *args)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, filter="data")
        else:  # pragma: no cover - Python < 3.10.12
            archive.extractall(dest)
    return dest if rel in ("", ".") else dest / rel


def staged_removals(root: Path) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    """What the staged change takes away, relative to ``root``: deleted
    paths, and renames as (old, new). pre-commit passes only the files that
    still exist, so the hook asks git for these itself."""
    toplevel(root)
    proc = _git(root, "diff", "--cached", "--name-status", "-z", "-M", "--relative", "--no-ext-diff")
    fields = [f.decode("utf-8", "surrogateescape") for f in proc.stdout.split(b"\0")]
    deleted: set[str] = set()
    renamed: list[tuple[str, str]] = []
    i = 0
    while i < len(fields) and fields[i]:
        status = fields[i]
        if status.startswith(("R", "C")):
            if status.startswith("R"):
                renamed.append((fields[i + 1], fields[i + 2]))
            i += 3
            continue
        if status.startswith("D"):
            deleted.add(fields[i + 1])
        i += 2
    return frozenset(deleted), tuple(sorted(renamed))
