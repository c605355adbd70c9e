"""The GPU worker: brings up the device, the model runner and the KV cache."""

import torch

from .config import EngineConfig
from .kv_cache import KVCachePool, block_bytes
from .memory import MemorySnapshot, plan_kv_blocks, query_free_bytes
from .model_runner import GPUModelRunner, SpeculativeModelRunner


class Worker:
    def __init__(self, config: EngineConfig, rank: int = 0):
        self.config = config
        self.rank = rank
        self.device = torch.device("cuda", rank)
        self.model_runner = None
        self.kv_cache = None

    def init_device(self, speculative: bool = False) -> None:
        torch.cuda.set_device(self.device)
        torch.cuda.empty_cache()
        # The baseline every later budget is computed from. Taken before the
        # runner exists, it cannot see the runner's persistent buffers.
        self.init_snapshot = MemorySnapshot(self.device)
        if speculative:
            self.model_runner = SpeculativeModelRunner(self.config, self.device)
        else:
            self.model_runner = GPUModelRunner(self.config, self.device)

    def load_model(self) -> None:
        self.model_runner.load_model()

    def initialize_cache(self) -> None:
        """Size the KV cache from what is free right now."""
        free = query_free_bytes(self.device)
        num_blocks = plan_kv_blocks(free, block_bytes(self.config), self.config.gpu_memory_utilization)
        self.kv_cache = KVCachePool(self.config, num_blocks, self.device)

    def execute_model(self, batch):
        return self.model_runner.execute_model(batch)
