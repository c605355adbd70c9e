"""A planned scratch workspace: one slab, carved into named buffers per step."""

import torch

from .config import EngineConfig


class ScratchPlan:
    """Every per-step buffer of the forward pass comes from this slab, so the
    forward pass itself never asks the allocator for memory."""

    def __init__(self, config: EngineConfig, device: torch.device):
        self.device = device
        self.rows = config.max_num_tokens
        self.topk = 64
        self.slab = torch.empty(self.rows * config.hidden_size * 4, dtype=torch.uint8, device=device)
        self._offsets = {"scores": 0, "indices": self.rows * self.topk * 4}
        self._overflow = None

    def get_scores(self, rows: int) -> torch.Tensor:
        return self.slab[: rows * self.topk * 4].view(torch.float32).view(rows, self.topk)

    def get_simultaneous(self, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
        """Several views at once, laid out one after another in the slab."""
        views, offset = [], 0
        for shape in shapes:
            numel = 1
            for dim in shape:
                numel *= dim
            views.append(self.slab[offset : offset + 4 * numel].view(torch.float32).view(shape))
            offset += 4 * numel
        return views

    def get_indices(self, rows: int) -> torch.Tensor:
        start = self._offsets["indices"]
        return self.slab[start : start + rows * self.topk * 8].view(torch.int64).view(rows, self.topk)

    def overflow(self, numel: int) -> torch.Tensor:
        """Rare large requests: keep one buffer and grow it when it is too small."""
        if self._overflow is None or self._overflow.numel() < numel:
            self._overflow = torch.empty(numel, dtype=torch.float32, device=self.device)
        return self._overflow[:numel]
