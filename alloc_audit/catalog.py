"""Reads ``rules/`` (API catalogues, tier patterns, rule packs) and the
project's additions into one frozen ``Catalog``.

The data ships inside the wheel as ``alloc_audit/_rules``; in a source
checkout it is the top-level ``rules/`` directory. ``Catalog.digest`` hashes
everything that changes what extraction produces (catalogues, packs,
preprocessing macros), so the fact cache is invalidated when any of it
changes; tier patterns are applied after the cache and are not part of it.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import API_ENTRY_KEYS, TIER_CRITERIA, TIERS, Config, integer_ceiling, toml_error_line
from .errors import UsageError
from .model import SiteKind
from .pack import PACK_FIELDS, RulePack

if TYPE_CHECKING:
    from .pipeline.prefilter import Prefilter

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PY_DEVICE_MODES = ("keyword", "inherit", "cuda", "to-args", "loader", "none")
CPP_DEVICE_MODES = ("none", "cuda", "options", "inherit")
_KINDS = tuple(k.value for k in SiteKind)


def data_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_rules", here.parent / "rules"):
        if (candidate / "tiers.toml").is_file():
            return candidate
    raise UsageError("alloc-audit's rule data (rules/) is missing; reinstall the package")


@dataclass(frozen=True)
class ApiSpec:
    """How one catalogue API makes sites."""

    api: str
    kind: SiteKind
    device: str = "none"
    shape: str = "none"
    size: tuple[int, ...] = ()
    target: str = "assign"
    device_keyword: str = "device"  # the keyword naming the device (`map_location` for `torch.load`)


@dataclass(frozen=True)
class ApiCatalog:
    py_names: Mapping[str, ApiSpec] = field(default_factory=dict)
    py_leaf: Mapping[str, ApiSpec] = field(default_factory=dict)
    py_methods: Mapping[str, ApiSpec] = field(default_factory=dict)
    py_exports: frozenset[str] = frozenset()
    py_device_contexts: frozenset[str] = frozenset()
    py_loader_engines: frozenset[str] = frozenset()  # engines whose loader calls a plugin's create_weights in one
    py_non_retaining: frozenset[str] = frozenset()  # callees that read a buffer and keep nothing of it
    py_other_runtimes: frozenset[str] = frozenset()  # packages whose `X.cuda(0)` is a device handle, not a copy
    cpp_names: Mapping[str, ApiSpec] = field(default_factory=dict)
    cpp_types: Mapping[str, ApiSpec] = field(default_factory=dict)
    cpp_methods: Mapping[str, ApiSpec] = field(default_factory=dict)
    cpp_exports: frozenset[str] = frozenset()
    attribute_macros: tuple[str, ...] = ()
    specifier_macros: tuple[str, ...] = ()
    lone_macro_lines: bool = True

    def api_names(self) -> frozenset[str]:
        """Every api a direct site can have (a derived site's api is a
        project factory's name instead)."""
        specs = (*self.py_names.values(), *self.py_leaf.values(), *self.py_methods.values(),
                 *self.cpp_names.values(), *self.cpp_types.values(), *self.cpp_methods.values())
        return frozenset(spec.api for spec in specs)

    def cpp_lookup(self, callee: str) -> ApiSpec | None:
        """Match a qualified C++ callee against the catalogue (see cpp.toml)."""
        name = callee[2:] if callee.startswith("::") else callee
        spec = self.cpp_names.get(name)
        if spec is None and "::" in name:
            spec = self.cpp_names.get(name.rsplit("::", 1)[1]) if name.startswith("std::") else None
        return spec


@dataclass(frozen=True)
class TierPattern:
    tier: str
    reason: str
    criteria: tuple[tuple[str, tuple[str, ...]], ...]
    origin: str = ""


# TIER_CRITERIA: the keys of a tier pattern (config.py, which checks configured ones)


@dataclass(frozen=True)
class CallerGlobs:
    """Who calls a function decides its tier over its name (rules/tiers.toml
    [callers]): ``per_step`` functions run on every step; ``load`` functions
    run while weights or checkpoints load; ``once`` functions run once per
    process (``main``, ``configure``)."""

    per_step: tuple[str, ...] = ()
    load: tuple[str, ...] = ()
    once: tuple[str, ...] = ()
    checkpoint: tuple[str, ...] = ()  # calls that read a tensor from a checkpoint (`*.get_slice`)
    converter: tuple[str, ...] = ()  # first words of a folder or file that converts or exports weights
    quantiser: tuple[str, ...] = ()  # "entry:saver" method pairs of an offline quantiser (`quantize:save_quantized*`)


@dataclass(frozen=True)
class Catalog:
    apis: ApiCatalog
    pack: RulePack
    tiers: tuple[TierPattern, ...]
    digest: str
    callers: CallerGlobs = CallerGlobs()
    # torch module classes that hold no tensor unless one is passed in (rules/tiers.toml [modules])
    stateless_modules: frozenset[str] = frozenset()

    @cached_property
    def prefilter(self) -> Prefilter:
        """Compiled from the APIs and the pack on first use (a run the stored result answers never asks)."""
        from .pipeline.prefilter import compile_prefilter

        compiled = _PREFILTERS.get(self.digest)
        if compiled is None:  # the digest covers every input of the APIs and the pack
            compiled = _PREFILTERS[self.digest] = compile_prefilter(self.apis, self.pack)
        return compiled


# digest -> the APIs and the pack built from the catalogues it covers
_BUILT: dict[str, tuple[ApiCatalog, RulePack]] = {}
# digest -> compiled prefilter: a process that loads the same catalogue again
# (the test suite, many scans in one process) compiles it once
_PREFILTERS: dict[str, Prefilter] = {}


# ---------------------------------------------------------------- loading


def load_catalog(config: Config) -> Catalog:
    base = data_dir()
    sources: list[tuple[str, Mapping[str, Any], str]] = [
        ("rules/apis/python.toml", _read_toml(base / "apis" / "python.toml"), "python"),
        ("rules/apis/cpp.toml", _read_toml(base / "apis" / "cpp.toml"), "cpp"),
    ]
    for path in config.api_catalogues:
        sources.append((str(path), _read_toml(path), "python"))
    packs: list[tuple[str, Mapping[str, Any]]] = []
    if config.default_pack:
        packs.append(("rules/packs/default.toml", _read_toml(base / "packs" / "default.toml")))
    for path in config.rule_packs:
        packs.append((str(path), _read_toml(path)))
    shipped_tiers = _read_toml(base / "tiers.toml")
    tiers = _build_tiers(config, shipped_tiers)
    callers_table = shipped_tiers.get("callers", {})
    callers = CallerGlobs(per_step=_str_tuple("rules/tiers.toml", callers_table, "per-step"),
                          load=_str_tuple("rules/tiers.toml", callers_table, "load"),
                          once=_str_tuple("rules/tiers.toml", callers_table, "once"),
                          checkpoint=_str_tuple("rules/tiers.toml", callers_table, "checkpoint-read"),
                          converter=_str_tuple("rules/tiers.toml", callers_table, "converter"),
                          quantiser=_str_tuple("rules/tiers.toml", callers_table, "quantiser"))
    digest_src = json.dumps(
        {
            "version": __version__,
            "apis": [s[1] for s in sources],
            "config-apis": [dict(a) for a in config.apis],
            "allocators": list(config.allocators),
            "macros": list(config.preprocess_macros),
            "pack": [p[1] for p in packs],
            "knobs": [list(k) for k in config.pack_extensions],
            "depths": [list(d) for d in config.pack_depths],
        },
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(digest_src.encode()).hexdigest()[:16]
    built = _BUILT.get(digest)
    if built is None:  # the digest covers every input of the APIs and the pack
        built = _BUILT[digest] = (_build_apis(sources, config), _build_pack(packs, config))
    apis, pack = built
    return Catalog(
        apis=apis,
        pack=pack,
        tiers=tiers,
        digest=digest,
        callers=callers,
        stateless_modules=frozenset(_str_tuple("rules/tiers.toml", shipped_tiers.get("modules", {}), "stateless")),
    )


@lru_cache(maxsize=32)
def _read_toml_cached(path: str, mtime: float) -> Mapping[str, Any]:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def _read_toml(path: Path) -> Mapping[str, Any]:
    try:
        return _read_toml_cached(str(path), path.stat().st_mtime)
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"invalid TOML: {exc}", str(path), toml_error_line(exc)) from None


def _str_tuple(where: str, entry: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"'{key}' must be a list of strings", where)
    return tuple(value)


_API_KEYS = set(API_ENTRY_KEYS)


def _spec(where: str, entry: Mapping[str, Any], api: str, cpp: bool) -> ApiSpec:
    unknown = set(entry) - _API_KEYS
    if unknown:
        raise UsageError(f"unknown key(s) {', '.join(sorted(unknown))} in an api entry", where)
    kind = entry.get("kind", "device")
    if kind not in _KINDS:
        raise UsageError(f"api {api!r}: unknown kind {kind!r}; use one of {', '.join(_KINDS)}", where)
    modes = CPP_DEVICE_MODES if cpp else PY_DEVICE_MODES
    device = entry.get("device", "cuda" if kind == "device" else "none")
    if device not in modes:
        raise UsageError(f"api {api!r}: unknown device mode {device!r}; use one of {', '.join(modes)}", where)
    shape = entry.get("shape", "first")
    if not isinstance(shape, str) or not re.fullmatch(r"positional|first|none|arg:\d+", shape):
        raise UsageError(f"api {api!r}: shape must be positional, first, none or arg:N", where)
    size = entry.get("size", [0])
    if not isinstance(size, list) or not all(isinstance(i, int) for i in size):
        raise UsageError(f"api {api!r}: size must be a list of argument indexes", where)
    target = entry.get("target", "assign")
    if not isinstance(target, str) or not re.fullmatch(r"assign|arg:\d+", target):
        raise UsageError(f"api {api!r}: target must be assign or arg:N", where)
    keyword = entry.get("device-keyword", "device")
    if not isinstance(keyword, str) or not keyword.isidentifier():
        raise UsageError(f"api {api!r}: device-keyword must be a keyword argument's name", where)
    return ApiSpec(api=api, kind=SiteKind(kind), device=device, shape=shape, size=tuple(size), target=target,
                   device_keyword=keyword)


def _build_apis(sources: list[tuple[str, Mapping[str, Any], str]], config: Config) -> ApiCatalog:
    py_names: dict[str, ApiSpec] = {}
    py_leaf: dict[str, ApiSpec] = {}
    py_methods: dict[str, ApiSpec] = {}
    cpp_names: dict[str, ApiSpec] = {}
    cpp_types: dict[str, ApiSpec] = {}
    cpp_methods: dict[str, ApiSpec] = {}
    py_exports: set[str] = set()
    cpp_exports: set[str] = set()
    contexts: set[str] = set()
    engines: set[str] = set()
    non_retaining: set[str] = set()
    other_runtimes: set[str] = set()
    attr_macros: list[str] = []
    spec_macros: list[str] = []
    lone = True

    def add_entry(where: str, entry: Mapping[str, Any], cpp: bool) -> None:
        if not isinstance(entry, dict):
            raise UsageError("each [[api]] entry must be a table", where)
        prefix = entry.get("prefix", "Tensor::" if cpp else "Tensor.")
        for name in _str_tuple(where, entry, "names"):
            spec = _spec(where, entry, name, cpp)
            if cpp:
                cpp_names[name] = spec
                parts = name.split("::")
                for i in range(1, len(parts) - 1):
                    cpp_names.setdefault("::".join(parts[i:]), spec)
            else:
                py_names[name] = spec
        for leaf in _str_tuple(where, entry, "leaf"):
            (cpp_names if cpp else py_leaf)[leaf] = _spec(where, entry, leaf, cpp)
        for method in _str_tuple(where, entry, "methods"):
            (cpp_methods if cpp else py_methods)[method] = _spec(where, entry, prefix + method, cpp)
        for type_name in _str_tuple(where, entry, "types"):
            if not cpp:
                raise UsageError("'types' applies to C++/CUDA entries only", where)
            spec = _spec(where, entry, type_name, cpp)
            cpp_types[type_name] = spec
            parts = type_name.split("::")
            for i in range(1, len(parts) - 1):  # `cuda::vector` for `thrust::cuda::vector`, never bare `vector`
                cpp_types.setdefault("::".join(parts[i:]), spec)

    for where, data, language in sources:
        unknown = set(data) - {"api", "exports", "default-device", "preprocess", "language", "non-retaining",
                                 "other-runtimes"}
        if unknown:
            raise UsageError(f"unknown table(s) {', '.join(sorted(unknown))} in an API catalogue", where)
        language = data.get("language", language)
        if language not in ("python", "cpp"):
            raise UsageError(f"language must be \"python\" or \"cpp\", got {language!r}", where)
        cpp = language == "cpp"
        entries = data.get("api", [])
        if not isinstance(entries, list):
            raise UsageError(f"'api' must be an array of tables ([[api]]), got {type(entries).__name__}", where)
        for entry in entries:
            add_entry(where, entry, cpp)
        for table in ("exports", "default-device", "preprocess", "non-retaining", "other-runtimes"):
            if not isinstance(data.get(table, {}), dict):
                raise UsageError(f"[{table}] must be a table, got {type(data[table]).__name__}", where)
        exports = data.get("exports", {})
        py_exports.update(_str_tuple(where, exports, "leaf"))
        cpp_exports.update(_str_tuple(where, exports, "names"))
        contexts.update(_str_tuple(where, data.get("default-device", {}), "contexts"))
        engines.update(_str_tuple(where, data.get("default-device", {}), "engines"))
        non_retaining.update(_str_tuple(where, data.get("non-retaining", {}), "leaf"))
        other_runtimes.update(_str_tuple(where, data.get("other-runtimes", {}), "packages"))
        pre = data.get("preprocess", {})
        attr_macros += _str_tuple(where, pre, "attribute-macros")
        spec_macros += _str_tuple(where, pre, "specifier-macros")
        lone = bool(pre.get("lone-macro-lines", lone))

    where = config.source or "configuration"
    for entry in config.apis:
        language = entry.get("language", "python")
        if language not in ("python", "cpp", "both"):
            raise UsageError(f"apis: language must be python, cpp or both, got {language!r}", where)
        rest = {k: v for k, v in entry.items() if k != "language"}
        if language in ("python", "both"):
            add_entry(where, rest, False)
        if language in ("cpp", "both"):
            add_entry(where, rest, True)
    for name in config.allocators:
        # A project allocator: a function, method or constructor whose call
        # acquires device memory (`self._make_buffer(...)`, `vram_alloc(...)`).
        leaf = name.rsplit(".", 1)[-1].rsplit("::", 1)[-1]
        py_spec = ApiSpec(api=name, kind=SiteKind.DEVICE, device="cuda", shape="first", target="assign")
        cpp_spec = ApiSpec(api=name, kind=SiteKind.DEVICE, device="none", size=(0,), target="assign")
        py_leaf[leaf] = py_spec
        if "." in name:
            py_methods[leaf] = py_spec
        cpp_names[name] = cpp_spec
        cpp_names.setdefault(leaf, cpp_spec)

    spec_macros += list(config.preprocess_macros)
    return ApiCatalog(
        py_names=py_names,
        py_leaf=py_leaf,
        py_methods=py_methods,
        py_exports=frozenset(py_exports),
        py_device_contexts=frozenset(contexts),
        py_loader_engines=frozenset(engines),
        py_non_retaining=frozenset(non_retaining),
        py_other_runtimes=frozenset(other_runtimes),
        cpp_names=cpp_names,
        cpp_types=cpp_types,
        cpp_methods=cpp_methods,
        cpp_exports=frozenset(cpp_exports),
        attribute_macros=tuple(dict.fromkeys(attr_macros)),
        specifier_macros=tuple(dict.fromkeys(spec_macros)),
        lone_macro_lines=lone,
    )


def _build_pack(packs: list[tuple[str, Mapping[str, Any]]], config: Config) -> RulePack:
    values: dict[str, Any] = {}
    for where, data in packs:
        for section, table in data.items():
            if not isinstance(table, dict):
                raise UsageError(f"[{section}] must be a table", where)
            for key, value in table.items():
                name = PACK_FIELDS.get((section, key))
                if name is None:
                    raise UsageError(f"unknown rule-pack key [{section}] {key}", where)
                if isinstance(value, bool) or not isinstance(value, (int, list)):
                    raise UsageError(f"[{section}] {key} must be a list of strings or an integer", where)
                if isinstance(value, int):
                    if not 0 <= value <= integer_ceiling(key):
                        raise UsageError(f"[{section}] {key} must be between 0 and {integer_ceiling(key)}, got {value}",
                                         where)
                    values[name] = value
                else:
                    values[name] = tuple(dict.fromkeys((*values.get(name, ()), *_str_tuple(where, table, key))))
    for section, key, extra in config.pack_extensions:
        name = PACK_FIELDS[(section, key)]
        values[name] = tuple(dict.fromkeys((*values.get(name, ()), *extra)))
    for section, key, depth in config.pack_depths:
        values[PACK_FIELDS[(section, key)]] = depth
    return RulePack(**values)


def _build_tiers(config: Config, shipped: Mapping[str, Any]) -> tuple[TierPattern, ...]:
    patterns: list[TierPattern] = []
    where = config.source or "configuration"
    for glob, tier in config.class_tiers:
        patterns.append(
            TierPattern(
                tier=tier,
                reason=f"class {{class}} is configured as {tier} (class-tiers in {where})",
                criteria=(("class", (glob,)),),
                origin=where,
            )
        )
    for entry in config.tiers:
        patterns.append(_tier_pattern(where, entry))
    for entry in shipped.get("tier", []):
        patterns.append(_tier_pattern("rules/tiers.toml", entry))
    return tuple(patterns)


def _tier_pattern(where: str, entry: Mapping[str, Any]) -> TierPattern:
    unknown = set(entry) - {"tier", "reason", *TIER_CRITERIA}
    if unknown:
        raise UsageError(f"tier pattern: unknown key(s) {', '.join(sorted(unknown))}", where)
    tier = entry.get("tier")
    if tier not in TIERS:
        raise UsageError(f"tier pattern: unknown tier {tier!r}; use one of {', '.join(TIERS)}", where)
    reason = entry.get("reason", f"tier pattern in {where}")
    if not isinstance(reason, str):
        raise UsageError("tier pattern: reason must be a string", where)
    criteria = tuple((key, _str_tuple(where, entry, key)) for key in TIER_CRITERIA if key in entry)
    return TierPattern(tier=tier, reason=reason, criteria=criteria, origin=where)
