import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One tagged local clone of this repository and one pre-commit home for
    the whole session: the hook's environment is built once, not per test."""
    from clihelp import Release, tagged_snapshot

    base = tmp_path_factory.mktemp("release")
    url, tag = tagged_snapshot(base)
    return Release(url, tag, base / "pre-commit-home")
