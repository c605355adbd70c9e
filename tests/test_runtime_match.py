"""Matching recorded stacks to census sites (alloc_audit/runtime/match.py)
and normalising snapshot versions (runtime/snapshot.py), on small inline
cases: frame paths from other machines, line drift, implicit points, C++
frames by function name, old ``history`` stacks and unknown actions."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from alloc_audit.model import FileFacts, Language, Scope, Site, SiteKind, Span, Tier, Via, With, WithItem
from alloc_audit.runtime.match import Matcher, PathMap, cpp_function_name
from alloc_audit.runtime.snapshot import Frame, normalise, parse_metadata


def make_site(path: str, line: int, api: str = "torch.empty", scope: str = "Runner.__init__",
              kind: SiteKind = SiteKind.DEVICE, via: Via | None = None, language: Language = Language.PYTHON,
              end: int | None = None) -> Site:
    return Site(path=path, span=Span(line, 9, end or line, 40), language=language, api=api, kind=kind, scope=scope,
                tier=Tier.T2, via=via)


SITES = [
    make_site("pkg/runner.py", 10),
    make_site("pkg/runner.py", 20, api="torch.zeros", scope="Runner._make", end=21),
    make_site("pkg/runner.py", 30, api="self._make", scope="Runner.__init__",
              via=Via("torch.zeros", "pkg/runner.py", 20)),
    make_site("pkg/runner.py", 25, api="torch.empty", kind=SiteKind.PINNED_HOST),
    make_site("pkg/csrc/arena.cu", 47, api="cudaMalloc", scope="pkg::Arena::grow", language=Language.CUDA),
]
FACTS = {"pkg/runner.py": FileFacts(
    path="pkg/runner.py", language=Language.PYTHON, digest="",
    scopes=(Scope("Runner.__init__", "__init__", "function", "method", Span(8, 5, 32, 1)),
            Scope("Runner._make", "_make", "function", "method", Span(18, 5, 22, 1)),
            Scope("Runner.forward", "forward", "function", "method", Span(50, 5, 70, 1))),
    withs=(With("Runner.forward", Span(60, 9, 62, 1), Span(61, 13, 62, 1),
                (WithItem("torch.cuda.graph", (), None),)),),
)}
PATHS = ["pkg/runner.py", "pkg/csrc/arena.cu", "pkg/__init__.py", "other/runner.py"]


def matcher(maps: tuple[PathMap, ...] = ()) -> Matcher:
    return Matcher(SITES, FACTS, PATHS, "/src/proj", maps)


@pytest.mark.parametrize(("filename", "expected"), [
    pytest.param("/app/pkg/runner.py", "pkg/runner.py", id="container path, folder and file agree"),
    pytest.param("/usr/lib/python3/site-packages/pkg/runner.py", "pkg/runner.py", id="site-packages install"),
    pytest.param("/src/proj/pkg/runner.py", "pkg/runner.py", id="the root itself"),
    pytest.param("/x/y/runner.py", None, id="only the file name agrees: not ours"),
    pytest.param("runner.py", None, id="a bare name matching two files: ambiguous"),
    pytest.param("/x/torch/cuda/graphs.py", None, id="a library file"),
    pytest.param("arena.cu", "pkg/csrc/arena.cu", id="a bare, unique name (compute-sanitizer)"),
])
def test_frame_paths_map_by_longest_suffix(filename: str, expected: str | None) -> None:
    assert matcher().map_path(filename) == expected


def test_path_map_overrides_the_suffix() -> None:
    m = matcher((PathMap("/build/out", "pkg"),))
    assert m.map_path("/build/out/runner.py") == "pkg/runner.py"
    assert matcher().map_path("/build/out/runner.py") is None


def frames(*entries: tuple[str, int, str]) -> tuple[Frame, ...]:
    return tuple(Frame(f, line, name) for f, line, name in entries)


@pytest.mark.parametrize(("stack", "how", "site_line", "capture"), [
    pytest.param(frames(("/a/pkg/runner.py", 10, "__init__")), "exact", 10, False, id="exact line"),
    pytest.param(frames(("/a/pkg/runner.py", 21, "_make"), ("/a/pkg/runner.py", 30, "__init__")), "exact", 30, False,
                 id="derived caller names the buffer"),
    pytest.param(frames(("/a/pkg/runner.py", 21, "_make"), ("/a/pkg/runner.py", 12, "__init__")), "exact", 20, False,
                 id="helper line kept when the caller is no derived site"),
    pytest.param(frames(("/a/pkg/runner.py", 90, "_make")), "function", 20, False,
                 id="drifted: line outside any _make, nearest site in _make"),
    pytest.param(frames(("/a/pkg/runner.py", 55, "forward")), "implicit", None, False,
                 id="a real line of forward with no site"),
    pytest.param(frames(("/a/pkg/runner.py", 25, "__init__")), "implicit", None, False,
                 id="pinned-host site cannot hold device memory"),
    pytest.param(frames(("/t/torch/nn/functional.py", 9, "linear"), ("/a/pkg/runner.py", 61, "forward")),
                 "implicit", None, True, id="an op in a capture region"),
    pytest.param(frames(("??", 0, "c10::cuda::CUDACachingAllocator::malloc(unsigned long)"),
                        ("??", 0, "pkg::Arena::grow(unsigned long)"), ("/a/pkg/runner.py", 10, "__init__")),
                 "function", 47, False, id="C++ frame by function name"),
    pytest.param(frames(("/t/torch/cuda/graphs.py", 115, "capture_begin")), "outside-root", None, False,
                 id="framework only"),
    pytest.param((), "no-frames", None, False, id="no frames"),
])
def test_attribution(stack: tuple[Frame, ...], how: str, site_line: int | None, capture: bool) -> None:
    a = matcher().attribute(stack)
    assert a.how == how
    assert (SITES[a.site].span.line if a.site is not None else None) == site_line
    assert a.capture is capture


def test_cpp_function_names_lose_their_arguments() -> None:
    assert cpp_function_name("pkg::Arena::grow(unsigned long) const") == "pkg::Arena::grow"
    assert cpp_function_name("at::(anonymous namespace)::run(int)") == "at::{anon}::run"


def snapshot_dict(**changes: Any) -> dict[str, Any]:
    block = {"address": 100, "size": 512, "requested_size": 500, "state": "active_pending_free",
             "frames": [{"filename": "/a/pkg/runner.py", "line": 10, "name": "__init__"}]}
    data: dict[str, Any] = {
        "segments": [{"device": 0, "address": 100, "total_size": 2048, "allocated_size": 512, "stream": 7,
                      "segment_pool_id": (1, 3), "blocks": [block]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": 100, "size": 2048, "stream": 7, "time_us": 1, "frames": []},
            {"action": "alloc", "addr": 100, "size": 512, "stream": 7, "time_us": 2, "user_metadata":
             "phase=serve;step=3", "compile_context": "N/A", "frames": block["frames"]},
            {"action": "some_new_action", "addr": 0, "size": 0, "stream": 0, "time_us": 3},
        ]],
    }
    data.update(changes)
    return data


def test_normalise_reads_states_pools_metadata_and_counts_unknown_actions() -> None:
    snap = normalise(snapshot_dict(), "s.pickle")
    assert snap.blocks[0].live and snap.blocks[0].pool == (1, 3)
    assert snap.allocated == 512 and snap.reserved == 2048
    assert [e.action for e in snap.events] == ["segment_alloc", "alloc"]
    assert (snap.events[1].phase, snap.events[1].step, snap.events[1].compile_context) == ("serve", 3, "")
    assert snap.unknown_actions == (("some_new_action", 1),)
    assert snap.stack_kind == "python" and snap.has_metadata


def test_normalise_reads_the_older_history_stacks() -> None:
    data = snapshot_dict()
    block = data["segments"][0]["blocks"][0]
    block["history"] = [{"addr": 100, "real_size": 500, "frames": block.pop("frames")}]
    data["device_traces"] = []
    snap = normalise(data, "old.pickle")
    assert snap.stacks[snap.blocks[0].stack][0] == Frame("/a/pkg/runner.py", 10, "__init__")


def test_normalise_names_the_file_and_the_place_of_a_bad_field() -> None:
    data = snapshot_dict()
    data["segments"][0]["blocks"][0]["frames"] = [{"filename": 3, "line": "x", "name": None}]
    with pytest.raises(Exception, match=r"bad.pickle: segment 0 block 0: a frame's filename, line or name"):
        normalise(data, "bad.pickle")


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("phase=serve;step=3", ("serve", 3), id="phase and step"),
    pytest.param("warmup", ("warmup", None), id="a bare word"),
    pytest.param("step=x, phase=load", ("load", None), id="bad step ignored"),
    pytest.param("", ("", None), id="empty"),
])
def test_parse_metadata(text: str, expected: tuple[str, int | None]) -> None:
    assert parse_metadata(text) == expected


def test_cpp_frames_pick_the_site_whose_api_the_inner_frames_name() -> None:
    sites = [make_site("pkg/a.cu", 10, api="cudaMalloc", scope="pkg::Arena::Arena", language=Language.CUDA),
             make_site("pkg/a.cu", 11, api="cudaMallocAsync", scope="pkg::Arena::Arena", language=Language.CUDA),
             make_site("pkg/a.cu", 20, api="at::empty_like", scope="pkg::gate", language=Language.CUDA),
             make_site("pkg/a.cu", 21, api="torch::zeros", scope="pkg::gate", language=Language.CUDA),
             make_site("pkg/b.cu", 5, api="pkg::Arena", scope="pkg::build", language=Language.CUDA,
                       via=Via("cudaMalloc", "pkg/a.cu", 10))]
    m = Matcher(sites, {}, ["pkg/a.cu", "pkg/b.cu"], "/r")
    native = frames(("??", 0, "cudaMallocAsync"), ("??", 0, "pkg::Arena::Arena(unsigned long)"))
    assert m.attribute(native).site == 1
    zeros = frames(("??", 0, "at::_ops::zeros::call(c10::ArrayRef<long>)"), ("??", 0, "pkg::gate(at::Tensor)"))
    assert m.attribute(zeros).site == 3
    unknown = frames(("??", 0, "something_else"), ("??", 0, "pkg::gate(at::Tensor)"))
    assert m.attribute(unknown).site == 2
    # a caller that is a derived site of the constructor names the buffer, whichever allocation it was
    built = frames(("??", 0, "cudaMallocAsync"), ("??", 0, "pkg::Arena::Arena(unsigned long)"),
                   ("??", 0, "pkg::build(long)"))
    assert m.attribute(built).site == 4


def test_verdicts_for_a_t1_site_allocating_after_load_and_a_t2_site_freed_every_step() -> None:
    from alloc_audit.runtime.join import join

    sites = [dataclasses.replace(make_site("pkg/runner.py", 10), tier=Tier.T1),  # weights
             dataclasses.replace(make_site("pkg/runner.py", 20, api="torch.zeros", scope="Runner._make", end=21),
                                 tier=Tier.T2)]
    weights = [{"filename": "/a/pkg/runner.py", "line": 10, "name": "__init__"}]
    buffers = [{"filename": "/a/pkg/runner.py", "line": 20, "name": "_make"}]
    trace = [{"action": "alloc", "addr": 1000, "size": 512, "time_us": 1, "frames": weights,
              "user_metadata": "phase=load"}]
    t = 10
    for step in range(4):
        meta = f"phase=serve;step={step}"
        trace += [{"action": "alloc", "addr": 5000, "size": 512, "time_us": t, "frames": buffers,
                   "user_metadata": meta},
                  {"action": "free_requested", "addr": 5000, "size": 512, "time_us": t + 5, "frames": buffers},
                  {"action": "free_completed", "addr": 5000, "size": 512, "time_us": t + 6, "frames": buffers}]
        t += 10
    trace.append({"action": "alloc", "addr": 2000, "size": 512, "time_us": t, "frames": weights,
                  "user_metadata": "phase=serve;step=3"})
    blocks = [{"address": a, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": weights}
              for a in (1000, 2000)]
    snap = normalise({"segments": [{"address": 1000, "total_size": 4096, "allocated_size": 1024, "blocks": blocks}],
                      "device_traces": [trace]}, "s.pickle")
    result = join([snap], Matcher(sites, FACTS, PATHS, "/src/proj"), sites)
    verdicts = {j.site.span.line: (j.verdict, j.note) for j in result.sites}
    assert verdicts[10][0] == "disagrees"
    assert "T1 site allocating after load (1 allocations in serve)" in verdicts[10][1]
    assert verdicts[20][0] == "disagrees" and "freed before the snapshot (1.0 allocations per step)" in verdicts[20][1]
    assert {(f.rule, f.path, f.line) for f in result.findings} >= {
        ("tier-lifetime-mismatch", "pkg/runner.py", 10), ("tier-lifetime-mismatch", "pkg/runner.py", 20),
        ("per-step-churn", "pkg/runner.py", 20)}
    assert result.steps == 4 and result.accounted == result.live == 1024
