"""Kernel wrappers. These run inside captured CUDA graphs: a custom op the
framework captures, so alloc-audit is told about it in the configuration
(`captured = ["examples.minigen.ops.attention.*"]`)."""

import torch


def sparse_attention(hidden: torch.Tensor, scratch, rows: int, slices: int = 4) -> torch.Tensor:
    scores = scratch.get_scores(rows)
    indices = scratch.get_indices(rows)
    if slices > 1:
        # every other buffer comes from the plan; this one is sized per call
        partial = torch.empty((rows * slices, scratch.topk), dtype=torch.float32, device=hidden.device)
        torch.topk(partial.view(rows, -1), scratch.topk, out=(scores, indices))
    return hidden


def gated_mlp(x: torch.Tensor, scratch, hidden: int) -> torch.Tensor:
    gate, up = scratch.get_simultaneous((x.shape[0], hidden), (x.shape[0], hidden))
    torch.matmul(x, x.new_ones(x.shape[1], hidden), out=gate)
    return gate * up


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out = torch.empty_like(x)
    torch.ops.minigen.rms_norm(out, x, weight, eps)
    return out
