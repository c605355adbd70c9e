"""``alloc-audit join`` on the snapshots recorded from the demo engine on a
GPU (tests/data/runtime, see its README): no GPU or torch is needed here.

The acceptance of issue 13 is pinned: at least 95 % of the bytes live at the
snapshot are attributed to census sites, every demo site the run reaches
appears with its bytes, the static tiers agree with the observed lifetimes
except where the disagreement is real (the grow-on-demand overflow buffer,
tiered as per-call scratch, stays alive), and each deliberate hazard is
confirmed at runtime."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from clihelp import run_cli

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "runtime"
DEMO = REPO / "examples" / "minigen"


def line_of(rel: str, text: str) -> int:
    """The line of ``examples/minigen/<rel>`` holding ``text`` (the snapshots
    were recorded from these files, so their frames name these lines)."""
    for n, line in enumerate((DEMO / rel).read_text().splitlines(), 1):
        if text in line:
            return n
    raise AssertionError(f"{text!r} not in {rel}")


def join_json(*args: str) -> dict[str, Any]:
    result = run_cli("join", *args, "examples", "-f", "json", cwd=REPO)
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.fixture(scope="module")
def demo() -> dict[str, Any]:
    return join_json(str(DATA / "minigen-python.pickle.gz"))


def site(doc: dict[str, Any], rel: str, text: str) -> dict[str, Any]:
    line = line_of(rel, text)
    found = [s for s in doc["snapshot"]["sites"] if s["path"] == f"examples/minigen/{rel}" and s["line"] == line]
    assert found, f"no joined site at {rel}:{line}"
    return found[0]


def finding(doc: dict[str, Any], rule: str, rel: str, text: str) -> dict[str, Any]:
    line = line_of(rel, text)
    found = [f for f in doc["snapshot"]["findings"]
             if f["rule"] == rule and f["path"] == f"examples/minigen/{rel}" and f["line"] == line]
    assert found, f"no {rule} finding at {rel}:{line}"
    return found[0]


def test_the_demo_snapshot_is_accounted_for(demo: dict[str, Any]) -> None:
    summary = demo["snapshot"]["summary"]
    assert demo["schema"] == "alloc-audit-join/1"
    assert summary["accounted_share"] >= 95.0
    assert summary["live_bytes"] > 30 << 20  # the KV pool alone is ~28 MiB
    buckets = {b["name"]: b["bytes"] for b in demo["snapshot"]["buckets"]}
    # never drop bytes: live = sites + implicit + no frames + outside the tree
    assert summary["accounted_bytes"] + summary["implicit_bytes"] + buckets["no-frames"] \
        + buckets["outside-root"] == summary["live_bytes"]
    assert summary["live_bytes"] + buckets["cache-slack"] == summary["reserved_bytes"]


@pytest.mark.parametrize(("rel", "text", "live"), [
    pytest.param("worker.py", "self.kv_cache = KVCachePool(", True, id="KV block pool"),
    pytest.param("kv_cache.py", "self.block_tables = torch.zeros(", True, id="block tables"),
    pytest.param("model_runner.py", 'self.weights["embed"] = torch.empty(', True, id="embedding weights"),
    pytest.param("model_runner.py", 'self.weights[f"qkv.{layer}"]', True, id="weights under a device context"),
    pytest.param("model_runner.py", "self.input_ids = self._make_buffer(", True, id="persistent buffer"),
    pytest.param("model_runner.py", "self.inputs_embeds = self._make_buffer(", True, id="persistent buffer 2"),
    pytest.param("model_runner.py", "self.scratch = ScratchPlan(", True, id="scratch slab"),
    pytest.param("scratch.py", "self._overflow = torch.empty(", True, id="overflow buffer"),
    pytest.param("model_runner.py", "logits = torch.empty(", False, id="per-call logits"),
    pytest.param("model_runner.py", "hidden = torch.empty(", False, id="captured dummy input"),
    pytest.param("ops/attention.py", "partial = torch.empty(", False, id="captured op scratch"),
])
def test_every_reached_demo_site_appears_with_its_bytes(demo: dict[str, Any], rel: str, text: str,
                                                        live: bool) -> None:
    s = site(demo, rel, text)
    assert s["match"] == "exact"
    assert s["runtime"]["allocs"] >= 1
    assert (s["runtime"]["live_bytes"] > 0) is live
    assert s["runtime"]["peak_bytes"] >= s["runtime"]["live_bytes"] > 0 or not live


def test_static_tiers_agree_with_the_run(demo: dict[str, Any]) -> None:
    verdicts = {(s["path"], s["line"]): s["verdict"] for s in demo["snapshot"]["sites"]}
    # the overflow buffer is alive at the end of the run: it was tiered T4 and the
    # run disagreed (tier-lifetime-mismatch) until lazily created members became
    # T2; the run now confirms its tier
    overflow = ("examples/minigen/scratch.py", line_of("scratch.py", "self._overflow = torch.empty("))
    assert verdicts.pop(overflow) == "agrees"
    assert set(verdicts.values()) <= {"agrees", "not-reached", "not-visible"}
    assert not [f for f in demo["snapshot"]["findings"] if f["rule"] == "tier-lifetime-mismatch"]


@pytest.mark.parametrize(("rule", "rel", "text"), [
    pytest.param("alloc-in-capture", "model_runner.py", "hidden = torch.empty(", id="capture: dummy input"),
    pytest.param("alloc-in-capture", "model_runner.py", "residual = torch.empty_like(", id="capture: forward"),
    pytest.param("alloc-in-capture", "ops/attention.py", "partial = torch.empty(", id="capture: custom op"),
    pytest.param("snapshot-before-construction", "worker.py", "self.init_snapshot = MemorySnapshot(",
                 id="measured before the runner's buffers"),
    pytest.param("throwaway-graph-pool", "model_runner.py", "        pool = torch.cuda.graph_pool_handle()",
                 id="throwaway graph pool"),
    pytest.param("grow-on-demand", "scratch.py", "self._overflow = torch.empty(", id="grows on demand"),
    pytest.param("per-step-churn", "model_runner.py", "logits = torch.empty(", id="per-step churn"),
])
def test_the_deliberate_hazards_are_confirmed_at_runtime(demo: dict[str, Any], rule: str, rel: str,
                                                         text: str) -> None:
    f = finding(demo, rule, rel, text)
    assert f["status"] in ("confirmed", "runtime")
    assert f["runtime"], "a confirmed finding carries its runtime evidence"


def test_capture_and_churn_numbers(demo: dict[str, Any]) -> None:
    logits = site(demo, "model_runner.py", "logits = torch.empty(")["runtime"]
    assert logits["churn_per_step"] == 1.0 and logits["allocs"] == 16 and logits["capture_allocs"] == 0
    captured = site(demo, "ops/attention.py", "partial = torch.empty(")["runtime"]
    assert captured["capture_allocs"] == 8  # one per captured batch size, profile and production
    pools = {tuple(p["pool"]): p for p in demo["snapshot"]["pools"]}
    assert len(pools) == 2 and all(p["capture_bytes"] > 0 for p in pools.values())


def test_python_and_all_stacks_give_the_same_attribution(demo: dict[str, Any]) -> None:
    all_stacks = join_json(str(DATA / "minigen-all.pickle.gz"))
    assert all_stacks["snapshot"]["records"][0]["stacks"] == "all"
    assert demo["snapshot"]["records"][0]["stacks"] == "python"
    assert all_stacks["snapshot"]["summary"]["accounted_share"] >= 95.0
    assert {(s["path"], s["line"], s["verdict"]) for s in all_stacks["snapshot"]["sites"]} == \
        {(s["path"], s["line"], s["verdict"]) for s in demo["snapshot"]["sites"]}


@pytest.mark.parametrize("record", ["minigen-native.jsonl", "minigen-sanitizer.txt.gz"])
def test_native_records_confirm_the_retained_ipc_channel(record: str) -> None:
    doc = join_json(str(DATA / record))
    native = doc["native"]
    assert doc["snapshot"] is None
    channel = [s for s in native["sites"] if s["path"] == "examples/minigen/comm/pool.py" and s["api"] == "IpcChannel"
               and s["runtime"]["live_bytes"] == 12 << 20]
    assert channel and channel[0]["verdict"] == "disagrees"  # a per-call T4 site that stays for good
    rules = {(f["rule"], f["status"]) for f in native["findings"]}
    assert ("retained-per-entry-alloc", "confirmed") in rules


def test_the_preload_record_sees_pytorchs_segments_and_pinned_blocks_not_the_ctypes_channel() -> None:
    doc = join_json(str(DATA / "minigen-preload.jsonl.gz"))
    native = doc["native"]
    buckets = {b["name"]: b["bytes"] for b in native["buckets"]}
    assert buckets["pytorch-allocator"] > 30 << 20  # device segments: in the snapshot, left out here
    pinned = {(s["line"], s["tier"]): s["runtime"]["live_bytes"] for s in native["sites"] if s["runtime"]["allocs"]}
    assert pinned == {(line_of("model_runner.py", "self.input_ids_cpu = torch.zeros("), "T5b"): 2048,
                      (line_of("model_runner.py", "self.seq_lens_cpu = torch.zeros("), "T5b"): 32,
                      (line_of("model_runner.py", "staging = torch.empty("), "T5a"): 0}
    assert native["summary"]["live_bytes"] == 2080


def test_min_accounted_gates_the_exit_code() -> None:
    snap = str(DATA / "minigen-python.pickle.gz")
    assert run_cli("join", snap, "examples", "--min-accounted", "95", cwd=REPO).code == 0
    failing = run_cli("join", snap, "examples", "--min-accounted", "99.99", cwd=REPO)
    assert failing.code == 1 and "--min-accounted 99.99%: FAILS" in failing.out


def test_markdown_and_terminal_reports() -> None:
    snap = str(DATA / "minigen-python.pickle.gz")
    md = run_cli("join", snap, "examples", "-f", "markdown", cwd=REPO)
    assert md.code == 0 and "### Joined bytes per site" in md.out and "### Reconciliation" in md.out
    table = run_cli("join", snap, "examples", cwd=REPO)
    assert table.code == 0 and "Joined bytes per site" in table.out and "[confirmed]" in table.out
    assert "\x1b[" not in table.out


def test_the_third_party_snapshot_joins_without_its_source() -> None:
    # joined against the demo tree, the Llama run maps no frame: every byte is
    # in a named bucket and nothing crashes on its 7,700 events
    doc = join_json(str(DATA / "hf-llama-static.pickle.gz"))
    summary = doc["snapshot"]["summary"]
    assert summary["accounted_bytes"] == 0 and summary["live_bytes"] > 80 << 20
    buckets = {b["name"]: b["bytes"] for b in doc["snapshot"]["buckets"]}
    assert buckets["outside-root"] == summary["live_bytes"]


def write_snapshot(path: Path, frames: list[dict[str, Any]], size: int = 1 << 20) -> Path:
    data = {"segments": [{"device": 0, "address": 4096, "total_size": 2 * size, "allocated_size": size,
                          "stream": 0, "segment_pool_id": (0, 0),
                          "blocks": [{"address": 4096, "size": size, "requested_size": size,
                                      "state": "active_allocated", "frames": frames},
                                     {"address": 4096 + size, "size": size, "requested_size": 0,
                                      "state": "inactive", "frames": []}]}],
            "device_traces": [[]]}
    path.write_bytes(gzip.compress(pickle.dumps(data)))
    return path


def test_path_map_rewrites_frames_the_suffix_cannot_place(tmp_path: Path) -> None:
    line = line_of("kv_cache.py", "torch.zeros(shape")
    snap = write_snapshot(tmp_path / "s.pickle.gz", [{"filename": "/opt/app/kv_cache.py", "line": line,
                                                      "name": "__init__"}])
    plain = join_json(str(snap))["snapshot"]
    assert plain["summary"]["accounted_bytes"] == 0 and plain["buckets"][1]["bytes"] == 1 << 20
    mapped = join_json(str(snap), "--path-map", "/opt/app=examples/minigen")["snapshot"]
    assert mapped["summary"]["accounted_bytes"] == 1 << 20
    assert mapped["summary"]["frames_mapped"] == 1


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["nothing.pickle"], "nothing.pickle: no such snapshot, record or path", id="missing file"),
    pytest.param(["examples"], "name at least one snapshot", id="no snapshot"),
    pytest.param(["--path-map", "nonsense"], "--path-map wants OLD=NEW", id="bad path map"),
])
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    if args[0] == "--path-map":
        args = [str(DATA / "minigen-python.pickle.gz"), *args]
    result = run_cli("join", *args, cwd=REPO)
    assert result.code == 2 and message in result.err


@pytest.mark.parametrize(("payload", "message"), [
    pytest.param(pickle.dumps([1, 2, 3]), "segment 0: not a mapping", id="a list of ints"),
    pytest.param(pickle.dumps("text"), "not a memory snapshot", id="a string"),
    pytest.param(pickle.dumps({"segments": 5}), "'segments' and 'device_traces' must be lists", id="bad shape"),
    pytest.param(pickle.dumps({"segments": [{"address": "x"}]}), "segment 0: 'address' is missing or not an int",
                 id="bad field"),
    pytest.param(pickle.dumps({"segments": [], "device_traces": [[{"action": 3}]]}), "'action' is missing",
                 id="bad trace entry"),
])
def test_malformed_snapshots_exit_2_naming_the_file(tmp_path: Path, payload: bytes, message: str) -> None:
    path = tmp_path / "odd.pickle"
    path.write_bytes(payload)
    result = run_cli("join", str(path), "examples", cwd=REPO)
    assert result.code == 2
    assert "odd.pickle" in result.err and message in result.err


def test_oversized_and_truncated_snapshots_exit_2(tmp_path: Path) -> None:
    big = tmp_path / "big.pickle.gz"
    big.write_bytes(gzip.compress(b"\0" * (3 << 20)))
    result = run_cli("join", str(big), "examples", "--max-snapshot-mb", "1", cwd=REPO)
    assert result.code == 2 and "big.pickle.gz: larger than 1048576 bytes unpacked" in result.err
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(gzip.decompress((DATA / "minigen-python.pickle.gz").read_bytes())[:5000])
    result = run_cli("join", str(cut), "examples", cwd=REPO)
    assert result.code == 2 and "cut.pickle: not a readable snapshot pickle: truncated" in result.err


def test_cpp_frames_match_native_sites_by_function_name() -> None:
    # the demo's native side, built as a torch extension and run: libtorch's
    # allocations in minigen::fused_gate carry C++ frames (stacks="all"), and
    # compute-sanitizer's leak report names the arena's functions
    doc = join_json(str(DATA / "minigen-native-all.pickle.gz"), str(DATA / "minigen-sanitizer-native.txt.gz"))
    by_site = {(s["path"].rsplit("/", 1)[-1], s["api"]): s for part in ("snapshot", "native")
               for s in doc[part]["sites"] if s["runtime"]["allocs"] or s["runtime"]["live_bytes"]}
    # which site in fused_gate: the API the inner frames name (empty_like vs zeros)
    gate = by_site[("allocator.cu", "at::empty_like")]
    assert gate["match"] == "function" and gate["runtime"]["live_bytes"] == 128 << 10
    assert by_site[("allocator.cu", "torch::zeros")]["runtime"]["allocs"] == 1
    # the kept arena: its constructor's blocks go to the derived site that builds it
    arena = by_site[("demo_bindings.cu", "minigen::DeviceArena")]
    assert arena["runtime"]["live_bytes"] == (256 + 64 + 4) << 10 and arena["verdict"] == "disagrees"
    grown = by_site[("allocator.cu", "cudaMalloc")]
    assert grown["line"] == line_of("csrc/allocator.cu", "CUDA_CHECK(cudaMalloc(&buf_, need));")
    assert grown["runtime"]["live_bytes"] == 2 << 20


@pytest.mark.parametrize(("content", "message"), [
    pytest.param('{"action": "alloc", "addr": "x"}\n', "bad.jsonl:1: not a recorder line (ValueError", id="bad addr"),
    pytest.param('{"action": "alloc", "addr": 1, "size": 8, "frames": [{"line": 3}]}\n',
                 "bad.jsonl:1: not a recorder line (KeyError", id="frame without a file"),
    pytest.param('{"action": "alloc"\n', "bad.jsonl:1: not a recorder line (JSONDecodeError", id="cut short"),
])
def test_malformed_native_records_exit_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    result = run_cli("join", str(path), "examples", cwd=REPO)
    assert result.code == 2 and message in result.err
