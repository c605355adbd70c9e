"""What every renderer receives: the result, how to show the root, and the
allowlist comparison when the project has an allowlist."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model import Site
from ..ratchet.keys import site_key

if TYPE_CHECKING:
    from ..model import ScanResult
    from ..ratchet.compare import Comparison


@dataclass(frozen=True)
class ReportContext:
    result: ScanResult
    root_display: str
    allowlist: Comparison | None = None
    verbose: bool = False
    pivot: str = "tier"
    width: int | None = None
    base: Any = None  # a delta.Delta, when --base REF was given
    bindings: tuple[tuple[str, int], ...] = ()  # for size estimates (sizes.py)
    limit: int = 20  # rows per table and findings per rule, unless verbose

    def allowlisted(self, site: Site) -> bool | None:
        if self.allowlist is None:
            return None
        return site_key(site) in self.allowlist.covered_keys

    def allowlist_json(self) -> dict[str, Any]:
        assert self.allowlist is not None
        return self.allowlist.to_json()
