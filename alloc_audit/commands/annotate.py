"""Writing decisions into the source: a tier override
(``# alloc-audit: tier=T3 pooled KV blocks``) or a suppression with its reason
(``# alloc-audit: ignore[rule] reason``), on its own line above the statement
that holds the site.

Python is rewritten with libcst, so formatting, comments and the file's
encoding are kept exactly and only the comment line is added (a file with no
edits round-trips byte for byte). C++/CUDA gets a ``//`` line at the
statement's indentation, from the statement line tree-sitter found; line
endings follow the file. An existing annotation of the same kind right above
the statement is replaced, not duplicated. Files are written atomically.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write_bytes
from ..errors import UsageError
from ..model import ASSIGNABLE_TIERS, Language
from .outcome import Text
from .project import Options, Project, load_project, scan_project

_TIERS = ASSIGNABLE_TIERS


@dataclass(frozen=True)
class Decision:
    """One decision about the site at ``path:line``."""

    path: str
    line: int
    reason: str
    tier: str | None = None
    ignore: tuple[str, ...] = ()

    def comment_body(self) -> str:
        if self.tier is not None:
            return f"alloc-audit: tier={self.tier} {self.reason}"
        return f"alloc-audit: ignore[{', '.join(self.ignore)}] {self.reason}"

    @property
    def kind(self) -> str:
        return "tier" if self.tier is not None else "ignore"


@dataclass(frozen=True)
class Edit:
    """Put ``body`` on its own comment line above the statement at ``line``."""

    line: int
    body: str
    kind: str
    rules: tuple[str, ...] = ()


def validate(decision: Decision, known_rules: Iterable[str]) -> None:
    where = f"{decision.path}:{decision.line}"
    if not decision.reason.strip():
        raise UsageError(f"{where}: a decision needs a reason")
    if (decision.tier is None) == (not decision.ignore):
        raise UsageError(f"{where}: give either a tier or the rules to ignore")
    if decision.tier is not None and decision.tier not in _TIERS:
        raise UsageError(f"{where}: unknown tier {decision.tier!r}; use one of {', '.join(_TIERS)}")
    unknown = sorted(set(decision.ignore) - set(known_rules))
    if unknown:
        raise UsageError(f"{where}: unknown rule(s) {', '.join(unknown)}; see `alloc-audit rules list`")


_EXISTING = re.compile(r"alloc-audit:\s*(?:(tier)\s*=|ignore\[([^\]]*)\])")


def _same(existing: str, edit: Edit) -> bool:
    m = _EXISTING.search(existing)
    if m is None:
        return False
    if edit.kind == "tier":
        return m.group(1) == "tier"
    return m.group(2) is not None and {r.strip() for r in m.group(2).split(",")} == set(edit.rules)


# ---------------------------------------------------------------- Python (libcst)


def annotate_python(source: bytes, edits: Sequence[Edit]) -> bytes:
    if not edits:
        return source
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module)
    positions = wrapper.resolve(PositionProvider)
    by_line: dict[int, list[Edit]] = {}
    for edit in edits:
        by_line.setdefault(edit.line, []).append(edit)
    done: set[int] = set()

    class Insert(cst.CSTTransformer):
        def _leading(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
            line = positions[original].start.line
            todo = by_line.get(line)
            if not todo or line in done or not hasattr(updated, "leading_lines"):
                return updated
            done.add(line)
            lines = list(updated.leading_lines)
            for edit in todo:
                comment = cst.EmptyLine(indent=True, comment=cst.Comment("# " + edit.body))
                if lines and lines[-1].comment is not None and _same(lines[-1].comment.value, edit):
                    lines[-1] = comment
                else:
                    lines.append(comment)
            return updated.with_changes(leading_lines=lines)

        def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
            if isinstance(original, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return self._leading(original, updated)
            return updated

    new = wrapper.module.visit(Insert())
    missing = sorted(set(by_line) - done)
    if missing:
        raise UsageError(f"no statement starts at line {missing[0]}")
    return new.bytes


# ---------------------------------------------------------------- C++ / CUDA (lines)


def annotate_native(source: bytes, edits: Sequence[Edit]) -> bytes:
    if not edits:
        return source
    newline = b"\r\n" if b"\r\n" in source else b"\n"
    lines = source.split(newline)
    for edit in sorted(edits, key=lambda e: -e.line):
        index = edit.line - 1
        if not 0 <= index < len(lines):
            raise UsageError(f"line {edit.line} is outside the file")
        indent = re.match(rb"[ \t]*", lines[index]).group(0)  # type: ignore[union-attr]
        text = indent + b"// " + edit.body.encode("utf-8")
        above = lines[index - 1].strip() if index > 0 else b""
        if above.startswith(b"//") and _same(above.decode("utf-8", "replace"), edit):
            lines[index - 1] = text
        else:
            lines.insert(index, text)
    return newline.join(lines)


def apply_edits(path: Path, language: str, edits: Sequence[Edit]) -> bool:
    """Rewrite one file; True when it changed."""
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", str(path)) from None
    if language == "python":
        try:
            new = annotate_python(source, edits)
        except UsageError as exc:
            raise UsageError(exc.message, str(path)) from None
        except Exception as exc:  # libcst cannot parse the file (syntax error): nothing is written
            raise UsageError(f"cannot rewrite with libcst ({type(exc).__name__}); fix the syntax first",
                             str(path)) from None
    else:
        new = annotate_native(source, edits)
    if new == source:
        return False
    atomic_write_bytes(path, new)
    return True


def load_decisions(path: Path) -> list[Decision]:
    """Decisions from a JSON file (a list, or {"decisions": [...]}) or a TOML
    file ([[decision]] tables): each has site = "PATH:LINE", reason, and
    tier or ignore (a rule name or a list of them)."""
    import json
    import sys

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read decisions: {exc}", str(path)) from None
    try:
        if path.suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover
                import tomli as tomllib
            raw = tomllib.loads(text).get("decision", [])
        else:
            data = json.loads(text)
            raw = data.get("decisions", []) if isinstance(data, dict) else data
    except ValueError as exc:
        raise UsageError(f"cannot parse decisions: {exc}", str(path)) from None
    out = []
    for i, item in enumerate(raw, 1):
        if not isinstance(item, dict) or not isinstance(item.get("site"), str):
            raise UsageError(f"decision {i}: expected a table with site = \"PATH:LINE\"", str(path))
        out.append(parse_decision(item["site"], item.get("reason", ""), item.get("tier"), item.get("ignore"),
                                  f"{path} decision {i}"))
    return out


def parse_decision(site: str, reason: str, tier: str | None, ignore: object, where: str = "") -> Decision:
    m = re.fullmatch(r"(.+):(\d+)", site.strip())
    if m is None:
        raise UsageError(f"{where or site}: site must be PATH:LINE")
    rules: tuple[str, ...] = ()
    if isinstance(ignore, str):
        rules = (ignore,)
    elif isinstance(ignore, (list, tuple)):
        rules = tuple(str(r) for r in ignore)
    return Decision(m.group(1).replace("\\", "/"), int(m.group(2)), str(reason or ""), tier, rules)


# ---------------------------------------------------------------- the command


def apply_decisions(project: Project, decisions: list[Decision], options: Options | None = None) -> list[str]:
    """Write decisions into the sources above the statements they name;
    returns what was written (``path:line: # comment``)."""
    from ..pipeline.discover import language_of
    from ..rules import known_rule_names

    known = known_rule_names()
    for decision in decisions:
        validate(decision, known)
    config = project.config
    files = sorted({d.path for d in decisions})
    for rel in files:
        if not (config.root / rel).is_file():
            raise UsageError(f"no such file in the project: {rel}")
    # the files about to be rewritten are read afresh, never from the cache
    jobs = options.jobs if options is not None else None
    result = scan_project(project, [config.root / f for f in files], Options(jobs=jobs, no_cache=True))
    by_file: dict[str, list[Edit]] = {}
    written: list[str] = []
    for d in decisions:
        covering = [s for s in result.sites if s.path == d.path and s.stmt_line <= d.line <= s.span.end_line]
        finding = next((f for f in result.findings if f.path == d.path and f.line == d.line), None)
        line = covering[0].stmt_line if covering else (finding.stmt_line if finding else d.line)
        by_file.setdefault(d.path, []).append(Edit(line, d.comment_body(), d.kind, d.ignore))
        written.append(f"{d.path}:{line}: # {d.comment_body()}")
    for rel, edits in sorted(by_file.items()):
        lang = language_of(rel)
        apply_edits(config.root / rel, "python" if lang is Language.PYTHON else "native", edits)
    return written


def annotate(options: Options, site: str | None = None, tier: str | None = None, ignore: list[str] | None = None,
             reason: str = "", decisions: Path | None = None) -> Text:
    """Write a tier override or a suppression, with its reason, into the source above a site.

    Python is rewritten with libcst (formatting and encoding kept); C++/CUDA
    gets a // line at the statement's indentation.

    Examples:

      alloc-audit annotate --site src/kv.py:42 --tier T3 --reason "pooled KV blocks"

      alloc-audit annotate --site src/ops.cu:88 --ignore grow-on-demand --reason "warm-up only"

      alloc-audit annotate --decisions decisions.json
    """
    project = load_project(None, options.config_path)
    items = []
    if decisions is not None:
        items += load_decisions(decisions)
    if site is not None:
        items.append(parse_decision(site, reason, tier, list(ignore or ())))
    if not items:
        raise UsageError("nothing to do: give --site with --tier or --ignore and --reason, or --decisions FILE")
    return Text("".join(f"annotated {line}\n" for line in apply_decisions(project, items, options)))
