"""Memory measurements the worker budgets with."""

from dataclasses import dataclass, field

import torch


@dataclass
class MemorySnapshot:
    """What the device holds at one moment."""

    device: torch.device
    free_memory: int = field(init=False)
    total_memory: int = field(init=False)
    torch_peak: int = field(init=False)

    def __post_init__(self) -> None:
        self.free_memory, self.total_memory = torch.cuda.mem_get_info(self.device)
        self.torch_peak = torch.cuda.max_memory_allocated(self.device)


def query_free_bytes(device: torch.device) -> int:
    free, _total = torch.cuda.mem_get_info(device)
    return free


def plan_kv_blocks(free_bytes: int, bytes_per_block: int, utilization: float) -> int:
    budget = int(free_bytes * utilization)
    return max(budget // bytes_per_block, 16)
