import fcntl
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

if sys.dont_write_bytecode and not os.environ.get("ALLOC_AUDIT_TEST_NO_PYCACHE"):
    # PYTHONDONTWRITEBYTECODE would make every Python the suite starts (the
    # CLI in a subprocess, pre-commit's hook, the xdist workers) compile
    # alloc_audit from source again, and pytest rewrite the tests again:
    # ~0.5 s of CPU each, dozens of times. The suite writes bytecode
    # (__pycache__ is in .gitignore); set before xdist starts its workers, so
    # they and their children inherit it. ALLOC_AUDIT_TEST_NO_PYCACHE=1 keeps
    # the variable.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def _uses(item: pytest.Item, fixture: str) -> bool:
    return fixture in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first, in two heads, one per worker. pyproject runs
    xdist with ``--dist worksteal``: each worker gets one half of this order
    (the first worker the first half) and runs it from its head; a worker
    whose half is done takes the tail of the other's, so the short tests at
    the tails fill in at the end and neither worker is left idle while the
    other runs one long test. The first half starts with the fresh-team
    scenario (it builds the hook environment, ``release``) and half of the
    other ``slow`` tests; the second with every browser test, one after the
    other (one Chromium launch: the ``browser`` fixture), then the other
    tests of the hook environment (by then built: they would wait on the
    build at the head of a worker) and the rest of the ``slow`` tests. With
    ``-n 0`` the order is the same, in one process."""
    first_release = next((item for item in items if _uses(item, "release")), None)
    browser = [item for item in items if _uses(item, "browser")]
    release = [item for item in items if _uses(item, "release") and item is not first_release]
    taken = {id(item) for item in (*browser, *release, first_release) if item is not None}
    slow = [item for item in items if id(item) not in taken and item.get_closest_marker("slow") is not None]
    taken.update(id(item) for item in slow)
    rest = [item for item in items if id(item) not in taken]
    head_a = ([first_release] if first_release is not None else []) + slow[0::2]
    head_b = browser + release + slow[1::2]
    fill = max(0, len(items) // 2 - len(head_a))
    items[:] = head_a + rest[:fill] + head_b + rest[fill:]


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's common temp folder, the same for every xdist worker (with
    ``-n 0``, the session's basetemp)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the workers' basetemps are popen-gw0, popen-gw1, ... under it
    return base


@pytest.fixture(scope="session")
def shared_batches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the workers share the fixtures' language-folder scans
    (fixtures_harness.run_fixture_batched): one scan per run, not per worker."""
    base = run_folder(tmp_path_factory) / "fixture-batches"
    base.mkdir(exist_ok=True)
    return base


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One tagged local clone of this repository and one pre-commit home for
    the whole run, shared by the xdist workers (the run's common temp folder,
    the clone made under a lock): the hook's environment is built once per
    run, not once per worker. pre-commit locks its home itself, so a worker
    that wants the hook while the other builds it waits for that build. pip
    builds that environment without an index, its dependencies shared from
    this Python (clihelp.shared_dependencies): only the package is installed."""
    from clihelp import Release, shared_dependencies, tagged_snapshot

    base = run_folder(tmp_path_factory) / "release"
    base.mkdir(exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        url, tag = tagged_snapshot(base)
        pip = shared_dependencies(base / "dependencies")
    return Release(url, tag, base / "pre-commit-home", pip)


CHROMIUM = os.environ.get("ALLOC_AUDIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


_CHROMIUM_OPEN: dict[str, Any] = {}  # the running Playwright and its browser, while browser tests run


@pytest.fixture
def browser() -> Any:
    """Debian's Chromium through Playwright, for the HTML report tests; a skip
    without it, unless ALLOC_AUDIT_REQUIRE_BROWSER says CI must not skip.
    One browser for a run of consecutive browser tests (each test opens its
    own pages), closed after the last of them (pytest_runtest_teardown
    below), not at the end of the session: an idle Chromium and its open
    pages cost ~0.3 s of CPU every 10 s while the rest of the suite runs.
    The browser tests come one after the other (pytest_collection_modifyitems
    keeps their files' order), so it is launched once per worker that runs them."""
    if "browser" not in _CHROMIUM_OPEN:
        if not Path(CHROMIUM).exists():
            if os.environ.get("ALLOC_AUDIT_REQUIRE_BROWSER"):
                pytest.fail(f"no Chromium at {CHROMIUM} (install Debian's chromium)")
            pytest.skip("no Chromium installed")
        playwright = pytest.importorskip("playwright.sync_api")
        _CHROMIUM_OPEN["playwright"] = p = playwright.sync_playwright().start()
        _CHROMIUM_OPEN["browser"] = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
    return _CHROMIUM_OPEN["browser"]


def _close_browser() -> None:
    browser, p = _CHROMIUM_OPEN.pop("browser", None), _CHROMIUM_OPEN.pop("playwright", None)
    try:
        if browser is not None:
            browser.close()
    finally:
        if p is not None:
            p.stop()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if "browser" not in _CHROMIUM_OPEN:
        return
    if nextitem is None or "browser" not in getattr(nextitem, "fixturenames", ()):
        _close_browser()
    else:  # the pages this test opened (each in its own context) closed: the next test starts from none
        for context in list(_CHROMIUM_OPEN["browser"].contexts):
            context.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _close_browser()
