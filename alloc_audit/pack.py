"""The rule pack: the names the hazard rules look for (capture contexts,
memory readings, pools, ...), read from ``rules/packs/*.toml`` and extended
by a project's configuration.

Each knob is declared once, here: its field, the ``[section] key`` it has in
a pack file, and the configuration key a project extends it with (if any).
The pack loader (``catalog.py``) and the configuration (``config.py``)
derive their tables from these declarations, so a new knob is one field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def knob(section: str, key: str, config: str | None = None, default: Any = ()) -> Any:
    """A pack field: ``[section] key`` in a pack file; ``config`` is the
    ``[tool.alloc-audit]`` key that extends it (a list) or sets it (a depth)."""
    return field(default=default, metadata={"pack": (section, key), "config": config})


@dataclass(frozen=True)
class RulePack:
    """The names the hazard rules look for (rules/packs/default.toml)."""

    capture_contexts: tuple[str, ...] = knob("capture", "contexts", "capture-contexts")
    capture_begin: tuple[str, ...] = knob("capture", "begin", "capture-begin")
    capture_end: tuple[str, ...] = knob("capture", "end", "capture-end")
    capture_depth: int = knob("capture", "depth", "capture-depth", 3)
    # allocator tensors under capture known to be smaller than this are info (0: off)
    capture_info_bytes: int = knob("capture", "info-bytes", "capture-info-bytes", 0)
    captured: tuple[str, ...] = knob("capture", "captured", "captured")
    capture_checks: tuple[str, ...] = knob("capture", "checks", "capture-checks")
    scratch_accessors: tuple[str, ...] = knob("plan", "accessors", "scratch-accessors")
    measurements: tuple[str, ...] = knob("measure", "calls", "measurements")
    free_memory_readings: tuple[str, ...] = knob("free-memory", "calls", "free-memory-readings")
    free_memory_attributes: tuple[str, ...] = knob("free-memory", "attributes", "free-memory-attributes")
    flow_depth: int = knob("free-memory", "depth", "flow-depth", 3)
    fresh_pools: tuple[str, ...] = knob("graph-pool", "fresh", "fresh-pools")
    graph_destroyers: tuple[str, ...] = knob("graph-pool", "destroy", "graph-destroyers")
    throwaway_names: tuple[str, ...] = knob("graph-pool", "throwaway", "throwaway-names")
    pool_attributes: tuple[str, ...] = knob("graph-pool", "attributes", "pool-attributes")
    minting_contexts: tuple[str, ...] = knob("rollback", "contexts", "minting-contexts")
    rollback_names: tuple[str, ...] = knob("rollback", "restore", "rollback-names")
    per_entry_hooks: tuple[str, ...] = knob("retain", "hooks", "per-entry-hooks")
    container_add: tuple[str, ...] = knob("retain", "add")
    container_remove: tuple[str, ...] = knob("retain", "remove")
    contextmanagers: tuple[str, ...] = knob("retain", "contextmanagers")
    initialisers: tuple[str, ...] = knob("grow", "initialisers", "initialisers")
    hot_paths: tuple[str, ...] = knob("hot", "paths", "hot-paths")


def _is_depth(name: str) -> bool:
    """An integer knob (a depth, a byte threshold): set, not extended."""
    return name.endswith(("_depth", "_bytes"))


# pack (section, key) -> RulePack field
PACK_FIELDS: dict[tuple[str, str], str] = {f.metadata["pack"]: f.name for f in fields(RulePack)}
# configuration key -> (pack section, pack key): lists a project extends, depths it sets
PACK_KNOBS: dict[str, tuple[str, str]] = {
    f.metadata["config"]: f.metadata["pack"] for f in fields(RulePack) if f.metadata["config"] and not _is_depth(f.name)
}
PACK_DEPTHS: dict[str, tuple[str, str]] = {
    f.metadata["config"]: f.metadata["pack"] for f in fields(RulePack) if f.metadata["config"] and _is_depth(f.name)
}
