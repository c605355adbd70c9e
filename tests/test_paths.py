"""``rules/_lib/paths.decide``: which branch conditions known values decide."""

from __future__ import annotations

import pytest

from alloc_audit.pipeline.index.values import LITERAL, NONE, NOT_NONE, Value
from alloc_audit.rules._lib.paths import decide

FALSE = Value(LITERAL, False, "default False")
TRUE = Value(LITERAL, True, "passes True")


@pytest.mark.parametrize(("test", "env", "expected"), [
    pytest.param("deterministic", {"deterministic": FALSE}, False, id="parameter"),
    pytest.param("self.deterministic", {"self.deterministic": FALSE}, False, id="stored on self"),
    pytest.param("not self.deterministic", {"self.deterministic": TRUE}, False, id="negated attribute"),
    pytest.param("self.out is None", {"self.out": Value(NONE)}, True, id="attribute is None"),
    pytest.param("self.n > 4", {"self.n": Value(LITERAL, 8, "")}, True, id="attribute compared"),
    pytest.param("self.deterministic", {"deterministic": FALSE}, None, id="attribute not stored: undecided"),
    pytest.param("other.deterministic", {"self.deterministic": FALSE}, None, id="another object: undecided"),
    pytest.param("self.buf", {"self.buf": Value(NOT_NONE)}, None, id="not None says nothing of truth"),
])
def test_decide(test: str, env: dict[str, Value], expected: bool | None) -> None:
    assert decide(test, env, {}) is expected
