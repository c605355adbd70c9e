"""Configuration: ``[tool.alloc-audit]`` in ``pyproject.toml`` or the top level
of ``alloc-audit.toml`` -> a frozen ``Config``.

The project root is the directory of the nearest configuration file above the
scanned paths; without one, the enclosing git work tree; without that, the
scanned directory itself. Every key is validated: an unknown key or a wrong
type is a ``UsageError`` naming the file, the line and the key.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError, display_path
from .model import TIER_VALUES
from .pack import PACK_DEPTHS, PACK_KNOBS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CONFIG_NAME = "alloc-audit.toml"
DEFAULT_MAX_FILE_SIZE = 2 * 1024 * 1024
# Analysing a file takes about 50 times its size in memory when it is dense
# with calls (a 16 MB Python file of allocations: 760 MB, 24 s); above this
# ceiling one file could take the machine's memory, so larger files are
# always reported as not analysed.
MAX_FILE_SIZE_CEILING = 32 * 1024 * 1024
# Call depths the rules follow: each level multiplies the paths a rule may
# walk, so a depth in the millions would never finish; real chains from a
# capture to an allocation are a handful of calls deep.
MAX_DEPTH = 32
# Byte thresholds among the integer knobs (capture-info-bytes) are sizes, not
# depths: any size up to 1 TiB.
MAX_BYTES = 1 << 40


def integer_ceiling(key: str) -> int:
    """The largest value of an integer pack knob (pack or configuration key):
    a byte threshold, or else a call depth."""
    return MAX_BYTES if key.endswith("bytes") else MAX_DEPTH


TIERS = TIER_VALUES

_STR_LISTS = (
    "include",
    "exclude",
    "api-catalogues",
    "rule-packs",
    "enable",
    "disable",
    "allocators",
    "preprocess-macros",
    *PACK_KNOBS,
)
_KNOWN = (
    *_STR_LISTS,
    *PACK_DEPTHS,
    "max-file-size",
    "allowlist",
    "cache-dir",
    "jobs",
    "apis",
    "tiers",
    "class-tiers",
    "severity",
    "default-pack",
    "bindings",
    "unchecked",
    "roles",
    "fail-roles",
)


# The keys of an inline [[apis]] entry and of a [[tiers]] pattern (catalog.py
# reads the entries; both check against these sets).
API_ENTRY_KEYS = ("names", "leaf", "methods", "types", "prefix", "kind", "device", "device-keyword", "shape", "size",
                  "target", "language")
TIER_CRITERIA = ("kind", "function", "class", "scope", "path", "role", "api", "wrapper", "target", "kept")
TIER_ENTRY_KEYS = ("tier", "reason", *TIER_CRITERIA)


@dataclass(frozen=True)
class Config:
    root: Path
    source: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    allowlist: str = "allowlists"
    cache_dir: str = ".alloc-audit-cache"
    jobs: int | None = None
    api_catalogues: tuple[Path, ...] = ()
    apis: tuple[Mapping[str, Any], ...] = ()
    allocators: tuple[str, ...] = ()
    preprocess_macros: tuple[str, ...] = ()
    rule_packs: tuple[Path, ...] = ()
    default_pack: bool = True
    pack_extensions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    pack_depths: tuple[tuple[str, str, int], ...] = ()
    tiers: tuple[Mapping[str, Any], ...] = ()
    class_tiers: tuple[tuple[str, str], ...] = ()
    enable: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    severity: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # name -> integer, for the report's size estimates (sizes.py)
    bindings: tuple[tuple[str, int], ...] = ()
    # allowlist entries of files that could not be analysed: "fail" the
    # check and the gate (default) or "warn"
    unchecked: str = "fail"
    # code roles (roles.py): role -> path globs that override the conventions
    roles: tuple[tuple[str, tuple[str, ...]], ...] = ()
    fail_roles: tuple[str, ...] = ("production",)

    @property
    def allowlist_dir(self) -> Path:
        return self.root / self.allowlist


def find_project(start: Path) -> tuple[Path, Path | None]:
    """The project root and its configuration file (None when there is none)."""
    start = start.resolve()
    if start.is_file():
        start = start.parent
    for directory in (start, *start.parents):
        candidate = directory / CONFIG_NAME
        if candidate.is_file():
            return directory, candidate
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and _has_tool_table(pyproject):
            return directory, pyproject
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return directory, None
    return start, None


def _has_tool_table(pyproject: Path) -> bool:
    try:
        text = pyproject.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"^\s*\[\s*tool\s*\.\s*[\"']?alloc-audit", text, re.M) is not None


def load_config(root: Path, config_file: Path | None) -> Config:
    """Read and validate the configuration of the project at ``root``."""
    if config_file is None:
        return Config(root=root)
    display = display_path(config_file, root)
    try:
        raw_text = config_file.read_bytes().decode("utf-8")
        data = tomllib.loads(raw_text)
    except OSError as exc:
        raise UsageError(f"cannot read configuration: {exc.strerror}", display) from None
    except UnicodeDecodeError:
        raise UsageError("configuration is not valid UTF-8", display) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"invalid TOML: {exc}", display, toml_error_line(exc)) from None
    if config_file.name == "pyproject.toml":
        table = data.get("tool", {}).get("alloc-audit")
        section = "[tool.alloc-audit]"
        if table is None:
            return Config(root=root, source=display)
    else:
        table, section = data, CONFIG_NAME
    return _validate(table, raw_text, root, display, section, config_file.parent)


def toml_error_line(exc: Exception) -> int | None:
    """The line a TOML error names (tomllib says "(at line 3, column 5)")."""
    line = getattr(exc, "lineno", None)
    if isinstance(line, int):
        return line
    m = re.search(r"at line (\d+)", str(exc))
    return int(m.group(1)) if m else None


def _line_of(text: str, key: str, item: str | None = None) -> int | None:
    """The line of ``key = ...`` (or of a ``[...key]`` table header); with
    ``item``, the line of that entry inside the key's table."""
    quoted = rf"[\"']?{re.escape(key)}[\"']?"
    match = re.search(rf"^\s*(?:{quoted}\s*=|\[[^\]\n]*\b{re.escape(key)}[\"']?\s*\])", text, re.M)
    if match is None:
        return None
    if item is not None:
        inner = re.compile(rf"(?:^|[{{,])\s*[\"']?{re.escape(item)}[\"']?\s*=", re.M)
        found = inner.search(text, match.end())
        if found is not None:
            return text.count("\n", 0, found.start()) + 1 + (1 if text[found.start()] == "\n" else 0)
    return text.count("\n", 0, match.start()) + 1


def _validate(
    table: Mapping[str, Any], text: str, root: Path, display: str, section: str, base: Path
) -> Config:
    def fail(key: str, message: str, item: str | None = None) -> UsageError:
        return UsageError(message, display, _line_of(text, key, item))

    if section == CONFIG_NAME and isinstance(table.get("tool"), dict) and "alloc-audit" in table["tool"]:
        raise UsageError(f"{CONFIG_NAME} holds the settings at its top level: drop the [tool.alloc-audit] header "
                         "(that form is for pyproject.toml)", display, _header_line(text, "tool.alloc-audit"))
    for key in table:
        if key not in _KNOWN:
            hint = difflib.get_close_matches(key, _KNOWN, n=1)
            also = f"; did you mean '{hint[0]}'?" if hint else f"; known keys: {', '.join(sorted(_KNOWN))}"
            raise fail(key, f"unknown key '{key}' in {section}{also}")

    def str_list(key: str) -> tuple[str, ...]:
        value = table.get(key, [])
        if not isinstance(value, list):
            raise fail(key, f"'{key}' must be a list of strings, got {_type_name(value)}")
        for item in value:
            if not isinstance(item, str):
                raise fail(key, f"'{key}' must be a list of strings; it holds {_type_name(item)} ({item!r})")
        return tuple(value)

    def glob_list(key: str) -> tuple[str, ...]:
        values = str_list(key)
        for glob in values:
            problem = glob_problem(glob)
            if problem:
                raise fail(key, f"'{key}': the glob {glob!r} {problem}")
        return values

    def entries(key: str, known: tuple[str, ...]) -> tuple[Mapping[str, Any], ...]:
        """An array of tables whose keys are checked (with the entry's line)."""
        value = tables(key)
        for number, entry in enumerate(value):
            for name, item in entry.items():
                where = _entry_line(text, key, number, name)
                if name not in known:
                    unused = [k for k in known if k not in entry]  # a key the entry already has is no hint
                    hint = difflib.get_close_matches(name, unused, n=1, cutoff=0.5)
                    also = f"; did you mean '{hint[0]}'?" if hint else f"; known keys: {', '.join(known)}"
                    raise UsageError(f"unknown key '{name}' in [[{key}]] (entry {number + 1}){also}", display, where)
                if key == "tiers" and name in TIER_CRITERIA and not (
                        isinstance(item, str) or (isinstance(item, list) and all(isinstance(v, str) for v in item))):
                    raise UsageError(f"[[tiers]] (entry {number + 1}): '{name}' must be a glob or a list of globs, "
                                     f"got {_type_name(item)} ({item!r})", display, where)
        return value

    def integer(key: str, default: int | None, minimum: int, maximum: int | None = None) -> int | None:
        value = table.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise fail(key, f"'{key}' must be an integer >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise fail(key, f"'{key}' must be an integer from {minimum} to {maximum}, got {value!r}")
        return value

    def string(key: str, default: str) -> str:
        value = table.get(key, default)
        if not isinstance(value, str) or not value:
            raise fail(key, f"'{key}' must be a non-empty string, got {_type_name(value)}")
        return value

    def tables(key: str) -> tuple[Mapping[str, Any], ...]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise fail(key, f"'{key}' must be an array of tables ([[{key}]]), got {_type_name(value)}")
        return tuple(value)

    for key in PACK_KNOBS:
        str_list(key)
    extensions = tuple((sec, k, str_list(key)) for key, (sec, k) in PACK_KNOBS.items() if key in table)
    depths = tuple((sec, k, integer(key, None, 0, integer_ceiling(key)) or 0)
                   for key, (sec, k) in PACK_DEPTHS.items() if key in table)

    class_tiers_raw = table.get("class-tiers", {})
    if not isinstance(class_tiers_raw, dict):
        raise fail("class-tiers",
                   f"'class-tiers' must be a table of class glob = tier, got {_type_name(class_tiers_raw)}")
    for glob, tier in class_tiers_raw.items():
        if tier not in TIERS:
            raise fail("class-tiers",
                       f"'class-tiers': '{glob}' has unknown tier {tier!r}; use one of {', '.join(TIERS)}", glob)

    severity_raw = table.get("severity", {})
    if not isinstance(severity_raw, dict):
        raise fail("severity",
                   f"'severity' must be a table of rule = \"error\"|\"warning\", got {_type_name(severity_raw)}")
    for rule, sev in severity_raw.items():
        if sev not in ("error", "warning"):
            raise fail("severity", f"'severity': rule '{rule}' has {sev!r}; use \"error\" or \"warning\"", rule)
    named = [("severity", rule) for rule in severity_raw]
    named += [(key, rule) for key in ("enable", "disable") for rule in str_list(key)]
    if named:
        from .rules import known_rule_names  # only when rules are named: it imports every rule

        known_rules = known_rule_names()
        for key, rule in named:
            if rule not in known_rules:
                hint = difflib.get_close_matches(rule, list(known_rules), n=1)
                also = f"; did you mean '{hint[0]}'?" if hint else "; see `alloc-audit rules list`"
                raise fail(key, f"'{key}' names an unknown rule '{rule}'{also}", rule if key == "severity" else None)

    bindings_raw = table.get("bindings", {})
    if not isinstance(bindings_raw, dict):
        raise fail("bindings", f"'bindings' must be a table of name = integer, got {_type_name(bindings_raw)}")
    for name, number in bindings_raw.items():
        if isinstance(number, bool) or not isinstance(number, int):
            raise fail("bindings", f"'bindings': '{name}' must be an integer, got {_type_name(number)}", name)

    from .model import ROLES

    roles_raw = table.get("roles", {})
    if not isinstance(roles_raw, dict):
        raise fail("roles", f"'roles' must be a table of role = [path globs], got {_type_name(roles_raw)}")
    for role, globs in roles_raw.items():
        if role not in ROLES:
            raise fail("roles", f"'roles': unknown role {role!r}; use one of {', '.join(ROLES)}", role)
        if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
            raise fail("roles", f"'roles': '{role}' must be a list of path globs, got {_type_name(globs)}", role)
    fail_roles = str_list("fail-roles") if "fail-roles" in table else ("production",)
    for role in fail_roles:
        if role not in ROLES:
            raise fail("fail-roles", f"'fail-roles': unknown role {role!r}; use one of {', '.join(ROLES)}", role)

    default_pack = table.get("default-pack", True)
    if not isinstance(default_pack, bool):
        raise fail("default-pack", f"'default-pack' must be true or false, got {_type_name(default_pack)}")

    unchecked = table.get("unchecked", "fail")
    if unchecked not in ("fail", "warn"):
        raise fail("unchecked", f"'unchecked' must be \"fail\" or \"warn\", got {unchecked!r}")

    max_size = integer("max-file-size", DEFAULT_MAX_FILE_SIZE, 1, MAX_FILE_SIZE_CEILING)
    assert max_size is not None
    return Config(
        root=root,
        source=display,
        include=glob_list("include"),
        exclude=glob_list("exclude"),
        max_file_size=max_size,
        allowlist=string("allowlist", "allowlists"),
        cache_dir=string("cache-dir", ".alloc-audit-cache"),
        jobs=integer("jobs", None, 1, 1024),
        api_catalogues=tuple(_resolve(base, p) for p in str_list("api-catalogues")),
        apis=entries("apis", API_ENTRY_KEYS),
        allocators=str_list("allocators"),
        preprocess_macros=str_list("preprocess-macros"),
        rule_packs=tuple(_resolve(base, p) for p in str_list("rule-packs")),
        default_pack=default_pack,
        pack_extensions=extensions,
        pack_depths=depths,
        tiers=entries("tiers", TIER_ENTRY_KEYS),
        class_tiers=tuple(sorted(class_tiers_raw.items())),
        enable=str_list("enable"),
        disable=str_list("disable"),
        severity=tuple(sorted(severity_raw.items())),
        bindings=tuple(sorted(bindings_raw.items())),
        unchecked=unchecked,
        roles=tuple((role, tuple(globs)) for role, globs in sorted(roles_raw.items())),
        fail_roles=tuple(fail_roles),
    )


def glob_problem(glob: str) -> str | None:
    """Why a file glob can never match anything, or None. Paths are matched
    relative to the root with '/' (gitignore rules)."""
    if not glob.strip():
        return "is empty"
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            close = glob.find("]", i + 2 if glob[i + 1:i + 2] in ("!", "^", "]") else i + 1)
            if close < 0:
                return "has an unclosed '[' and can match nothing; write '\\[' for a literal bracket"
            i = close
        i += 1
    if "\\" in glob and re.search(r"\\[^\[\]*?!\\]", glob):
        return "uses '\\' as a path separator; paths are matched with '/'"
    return None


def _header_line(text: str, name: str) -> int | None:
    dotted = r"\s*\.\s*".join(re.escape(part) for part in name.split("."))
    match = re.search(rf"^\s*\[\s*{dotted}[\"']?\s*\]", text, re.M)
    return text.count("\n", 0, match.start()) + 1 if match else None


def _entry_line(text: str, key: str, number: int, item: str) -> int | None:
    """The line of ``item = ...`` inside the ``number``-th ``[[key]]`` table
    (or of the header itself)."""
    headers = list(re.finditer(rf"^\s*\[\[\s*(?:tool\s*\.\s*[\"']?alloc-audit[\"']?\s*\.\s*)?{re.escape(key)}\s*\]\]",
                               text, re.M))
    if number >= len(headers):
        return None
    start = headers[number].end()
    following = re.compile(r"^\s*\[", re.M).search(text, start)
    end = following.start() if following else len(text)
    found = re.compile(rf"^\s*[\"']?{re.escape(item)}[\"']?\s*=", re.M).search(text, start, end)
    at = found.start() if found else headers[number].start()
    return text.count("\n", 0, at) + 1 + (1 if text[at] == "\n" else 0)


def _resolve(base: Path, path: str) -> Path:
    return Path(os.path.normpath(base / path))


def _type_name(value: Any) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", float: "a number", list: "a list", dict: "a table"}
    return names.get(type(value), type(value).__name__)
