"""The restricted unpickler: snapshots are untrusted input. Payloads that
would import or call something under plain ``pickle.load`` are refused when
the opcode is read, nothing runs, and the CLI says which file and exits 2.

The hostile payloads are built with ``pickle.dumps`` of a ``__reduce__``
(dumping runs nothing); that they WOULD run code is shown from their
opcodes (``pickletools``), never by loading them with plain pickle."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

import pytest
from clihelp import run_cli

from alloc_audit.runtime.unpickle import PlainUnpickler, SnapshotError, load_plain

REPO = Path(__file__).resolve().parent.parent


class WritesMarker:
    """Under plain pickle.load this calls os.system(`touch MARKER`)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


class OpensFile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def calls_something(payload: bytes) -> bool:
    """The payload names a global and calls it: what plain pickle would execute."""
    ops = {op.name for op, _arg, _pos in pickletools.genops(payload)}
    return bool(ops & {"GLOBAL", "STACK_GLOBAL", "INST"}) and bool(ops & {"REDUCE", "INST", "OBJ", "NEWOBJ"})


def hostile_payloads(marker: Path) -> list[Any]:
    system = WritesMarker(marker)
    return [
        pytest.param(pickle.dumps(system, protocol=0), id="GLOBAL+REDUCE, protocol 0"),
        pytest.param(pickle.dumps(system, protocol=4), id="STACK_GLOBAL+REDUCE, protocol 4"),
        pytest.param(pickle.dumps({"segments": [system], "device_traces": []}, protocol=2),
                     id="hidden inside a snapshot-shaped dict"),
        pytest.param(pickle.dumps(OpensFile(marker), protocol=5), id="builtins.open"),
        # INST: a protocol-0 instance creation, `i` opcode, calls the class
        pytest.param(b"(S'touch " + str(marker).encode() + b"'\nios\nsystem\n.", id="INST opcode"),
    ]


@pytest.mark.parametrize("index", range(5))
def test_hostile_payloads_are_refused_and_nothing_runs(tmp_path: Path, index: int) -> None:
    marker = tmp_path / "MARKER"
    payload = hostile_payloads(marker)[index].values[0]
    assert calls_something(payload), "the payload must be one plain pickle would execute"
    with pytest.raises(pickle.UnpicklingError, match="refuses"):
        PlainUnpickler(io.BytesIO(payload)).load()
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(payload)
    with pytest.raises(SnapshotError, match="snapshot.pickle: not a plain-data snapshot: refuses to load"):
        load_plain(path)
    assert not marker.exists()


def test_the_cli_refuses_a_hostile_snapshot_with_exit_2(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(WritesMarker(marker), protocol=4)))
    result = run_cli("join", str(path), "examples", cwd=REPO)
    assert result.code == 2
    assert "evil.pickle.gz: not a plain-data snapshot: refuses to load posix.system" in result.err \
        or "evil.pickle.gz: not a plain-data snapshot: refuses to load os.system" in result.err
    assert result.out == ""
    assert not marker.exists()


def test_persistent_ids_and_extension_codes_are_refused(tmp_path: Path) -> None:
    persistent = b"\x80\x02Pabc\n."  # PERSID
    with pytest.raises(pickle.UnpicklingError, match="persistent"):
        PlainUnpickler(io.BytesIO(persistent)).load()
    ext = b"\x80\x02\x82\x01."  # EXT1 code 1: the copyreg registry, then find_class
    with pytest.raises((pickle.UnpicklingError, ValueError)):
        PlainUnpickler(io.BytesIO(ext)).load()


@pytest.mark.parametrize(("value", "ok"), [
    pytest.param({"a": [1, 2.5, "x", None, True, (1, 2)], "b": b"raw"}, True, id="plain containers"),
    pytest.param({1, 2}, True, id="a set"),
    pytest.param(complex(1, 2), False, id="complex needs builtins.complex"),
    pytest.param(Path("x"), False, id="a Path object"),
])
def test_only_plain_data_comes_out(value: Any, ok: bool) -> None:
    data = pickle.dumps(value, protocol=4)
    if ok:
        assert PlainUnpickler(io.BytesIO(data)).load() == value
    else:
        with pytest.raises(pickle.UnpicklingError, match="refuses"):
            PlainUnpickler(io.BytesIO(data)).load()


@pytest.mark.parametrize(("content", "message"), [
    pytest.param(b"", "truncated", id="empty file"),
    pytest.param(pickle.dumps({"segments": []})[:-7], "truncated", id="cut short"),
    pytest.param(b"\x00\x01garbage bytes", "malformed", id="garbage"),
])
def test_malformed_and_truncated_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    with pytest.raises(SnapshotError, match=f"bad.pickle: not a readable snapshot pickle: {message}"):
        load_plain(path)


def test_a_gzip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pickle.gz"
    path.write_bytes(gzip.compress(b"\0" * (4 << 20)))
    assert path.stat().st_size < 64 << 10
    with pytest.raises(SnapshotError, match="bomb.pickle.gz: larger than 1048576 bytes unpacked"):
        load_plain(path, limit=1 << 20)


def test_a_broken_gzip_stream_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "broken.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps({"segments": []}))[:-12])
    with pytest.raises(SnapshotError, match="broken.pickle.gz: cannot read"):
        load_plain(path)
