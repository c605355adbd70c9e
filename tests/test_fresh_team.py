"""The fresh-team scenario (examples/fresh-team.sh) end to end: a new git
repository from the demo, `allowlist init`, the hook installed by the real
pre-commit framework pinned to a tag of a local clone of this repository, a
new allocation blocked at commit, accepted (the gate fails), removed (the
gate passes)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from clihelp import REPO, Release, cli_command, pre_commit

pytestmark = pytest.mark.slow


def test_fresh_team_scenario(tmp_path: Path, release: Release) -> None:
    url, tag = release.url, release.tag
    shims = tmp_path / "bin"
    shims.mkdir()
    # the scenario calls `alloc-audit` and `pre-commit` by name, as a team would
    for name, command in (("alloc-audit", cli_command()), ("pre-commit", pre_commit())):
        shim = shims / name
        shim.write_text("#!/bin/sh\nexec " + " ".join(f'"{part}"' for part in command) + ' "$@"\n')
        shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "NO_COLOR": "1",
           **release.env}
    proc = subprocess.run(["bash", str(REPO / "examples" / "fresh-team.sh"), str(tmp_path / "work"), url, tag],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    blocked = out.index("== a commit adding an allocation is blocked")
    accepted = out.index("== accepting it")
    assert "new allocation site" in out[blocked:accepted], "the hook says why the commit was blocked"
    removed = out.index("== removing it")
    assert "allowlist grew" in out[accepted:removed], "the gate says what grew"
    assert out.rstrip().endswith("== the fresh team is set up")
