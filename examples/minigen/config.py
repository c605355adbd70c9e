"""Engine configuration (the sizes every buffer is derived from)."""

from dataclasses import dataclass

import torch

BLOCK_SIZE = 16


@dataclass
class EngineConfig:
    max_num_tokens: int = 3072
    max_num_seqs: int = 256
    hidden_size: int = 6144
    num_layers: int = 48
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 151936
    dtype: torch.dtype = torch.bfloat16
    gpu_memory_utilization: float = 0.9
    cudagraph_batch_sizes: tuple = (1, 2, 4, 8, 16, 32, 64, 128, 256)
