import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests (real pre-commit, browsers: marked ``slow``) first, in
    their files' order: xdist hands tests out in this order, so the long ones
    start at once and the short ones fill in around them, instead of one of
    them running alone at the end while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One tagged local clone of this repository and one pre-commit home for
    the whole session: the hook's environment is built once, not per test."""
    from clihelp import Release, tagged_snapshot

    base = tmp_path_factory.mktemp("release")
    url, tag = tagged_snapshot(base)
    return Release(url, tag, base / "pre-commit-home")


CHROMIUM = os.environ.get("ALLOC_AUDIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium through Playwright, for the HTML report tests; a skip
    without it, unless ALLOC_AUDIT_REQUIRE_BROWSER says CI must not skip."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("ALLOC_AUDIT_REQUIRE_BROWSER"):
            pytest.fail(f"no Chromium at {CHROMIUM} (install Debian's chromium)")
        pytest.skip("no Chromium installed")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()
