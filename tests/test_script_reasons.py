"""Module-level sites say where they run: a site under `if __name__ ==
"__main__":` runs when the file is run as a script, not at import (still
once: T2); one outside it keeps "runs at import". Tiers are checked by the
fixture itself (test_fixtures.py)."""

from __future__ import annotations

from fixtures_harness import FIXTURES, run_fixture


def test_main_block_sites_say_they_run_as_a_script() -> None:
    _, result = run_fixture(FIXTURES / "python/tiers-script-intermediates.py")
    reasons = {s.span.line: s.tier_reason for s in result.sites if s.via is None}
    assert reasons[49].startswith('module level, under `if __name__ == "__main__":`')
    assert reasons[16] == "module level (runs at import)"
    assert reasons[46].startswith("a script's intermediate: module-level inputs is rebound at line 49")
