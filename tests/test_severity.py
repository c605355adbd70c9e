"""Severity from consequence (DESIGN.md "Precision", issue 16): a driver
allocation or free under stream capture is an error, an allocator tensor
inside `torch.cuda.graph` a warning with the bytes it retains, lowered to
info under `capture-info-bytes`."""

from __future__ import annotations

import json
from pathlib import Path

from clihelp import run_cli

SOURCE = '''import torch

def capture(g, rt, n):
    with torch.cuda.graph(g):
        scale = torch.empty(4, dtype=torch.float32, device="cuda")
        big = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    return scale, big
'''
NATIVE = '''#include <cuda_runtime.h>
void capture(cudaStream_t s, cudaGraph_t* g, size_t n) {
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  float* tmp = nullptr;
  cudaMalloc(&tmp, n);
  cudaFree(tmp);
  cudaStreamEndCapture(s, g);
}
'''


def _findings(tree: Path) -> dict[int, dict]:
    result = run_cli("scan", ".", "--no-cache", "--format", "json", cwd=tree)
    assert result.code == 0, result.err
    return {(f["path"], f["line"]): f for f in json.loads(result.out)["findings"] if f["rule"] == "alloc-in-capture"}


def test_severity_follows_consequence(tmp_path: Path) -> None:
    (tmp_path / "alloc-audit.toml").write_text("")
    (tmp_path / "ops.py").write_text(SOURCE)
    (tmp_path / "graph.cu").write_text(NATIVE)
    found = _findings(tmp_path)
    assert found[("ops.py", 5)]["severity"] == "warning"
    assert "retains 16 B per captured graph" in found[("ops.py", 5)]["message"]
    assert found[("ops.py", 6)]["severity"] == "warning"
    assert found[("graph.cu", 5)]["severity"] == "error"
    assert found[("graph.cu", 6)]["severity"] == "error"
    assert "driver free" in found[("graph.cu", 6)]["message"]


def test_tiny_tensors_are_info_under_a_threshold(tmp_path: Path) -> None:
    (tmp_path / "alloc-audit.toml").write_text("capture-info-bytes = 1024\n")
    (tmp_path / "ops.py").write_text(SOURCE)
    found = _findings(tmp_path)
    assert found[("ops.py", 5)]["severity"] == "info"
    assert found[("ops.py", 6)]["severity"] == "warning"  # 4 MiB stays a warning
