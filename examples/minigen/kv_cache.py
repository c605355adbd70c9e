"""The paged KV cache: one slab per layer, handed out in fixed-size blocks."""

import torch

from .config import BLOCK_SIZE, EngineConfig


class KVCachePool:
    """Owns the KV slab for every layer; requests borrow blocks from it."""

    def __init__(self, config: EngineConfig, num_blocks: int, device: torch.device):
        self.num_blocks = num_blocks
        self.block_size = BLOCK_SIZE
        shape = (2, num_blocks, BLOCK_SIZE, config.num_kv_heads, config.head_dim)
        self.kv_caches = [
            torch.zeros(shape, dtype=config.dtype, device=device)
            for _ in range(config.num_layers)
        ]
        self.free_blocks = list(range(num_blocks))
        self.block_tables = torch.zeros(
            (config.max_num_seqs, num_blocks), dtype=torch.int32, device=device
        )

    def allocate(self, n: int) -> list[int]:
        taken, self.free_blocks = self.free_blocks[:n], self.free_blocks[n:]
        return taken

    def free(self, blocks: list[int]) -> None:
        self.free_blocks.extend(blocks)


def block_bytes(config: EngineConfig) -> int:
    element = torch.finfo(config.dtype).bits // 8
    return 2 * BLOCK_SIZE * config.num_kv_heads * config.head_dim * element * config.num_layers
