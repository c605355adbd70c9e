"""The model runner: persistent input buffers, weights, and CUDA graphs."""

import gc

import torch

from .comm.pool import CommPool, graph_capture
from .config import EngineConfig
from .ops.attention import sparse_attention
from .scratch import ScratchPlan


class CUDAGraphWrapper:
    """One captured graph per batch size; all wrappers share a pool."""

    _all: list["CUDAGraphWrapper"] = []

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.graph = None
        self.graph_pool = None
        CUDAGraphWrapper._all.append(self)

    def capture(self, fn, *args):
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.graph_pool):
            self.output = fn(*args)

    @classmethod
    def clear_all_graphs(cls) -> None:
        for wrapper in cls._all:
            wrapper.graph = None


class GPUModelRunner:
    def __init__(self, config: EngineConfig, device: torch.device):
        self.config = config
        self.device = device
        n = config.max_num_tokens
        self.input_ids = self._make_buffer(n, dtype=torch.int64)
        self.positions = self._make_buffer(n, dtype=torch.int64)
        self.inputs_embeds = self._make_buffer(n, config.hidden_size, dtype=config.dtype)
        self.logits_indices = self._make_buffer(config.max_num_seqs, dtype=torch.int32)
        # host side of the input staging: filled by the scheduler, copied with non_blocking
        self.input_ids_cpu = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(config.max_num_seqs, dtype=torch.int32, pin_memory=True)
        self.scratch = ScratchPlan(config, device)
        self.comm = CommPool(world_size=8, rank=0)
        self.graph_pool = torch.cuda.graph_pool_handle()
        self.wrappers = [CUDAGraphWrapper(bs) for bs in config.cudagraph_batch_sizes]
        self.weights = {}

    def _make_buffer(self, *size, dtype) -> torch.Tensor:
        return torch.zeros(*size, dtype=dtype, device=self.device)

    def load_model(self) -> None:
        cfg = self.config
        # random weights: the demo downloads nothing
        staging = torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype, pin_memory=True).normal_()
        self.weights["embed"] = torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype, device=self.device)
        self.weights["embed"].copy_(staging, non_blocking=True)
        torch.cuda.current_stream().synchronize()  # the staging buffer is freed on return
        with torch.device(self.device):
            for layer in range(cfg.num_layers):
                self.weights[f"qkv.{layer}"] = torch.empty(3 * cfg.hidden_size, cfg.hidden_size, dtype=cfg.dtype).normal_()

    def _dummy_run(self, num_tokens: int) -> torch.Tensor:
        hidden = torch.empty(num_tokens, self.config.hidden_size, dtype=self.config.dtype, device=self.device)
        return self.forward(self.input_ids[:num_tokens], hidden)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        residual = torch.empty_like(hidden)
        gated = hidden * self.weights["qkv.0"][0, : hidden.shape[1]]  # an op output: an implicit point
        out = sparse_attention(hidden, self.scratch, rows=input_ids.shape[0])
        return out + residual + gated

    def capture_model(self) -> None:
        """Capture one graph per batch size into the shared pool."""
        for wrapper in self.wrappers:
            wrapper.graph_pool = self.graph_pool
            wrapper.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(wrapper.graph, pool=self.graph_pool):
                wrapper.output = self._dummy_run(wrapper.batch_size)

    def profile_cudagraph_memory(self) -> int:
        """Estimate what capturing costs, then throw the graphs away."""
        pool = torch.cuda.graph_pool_handle()
        for wrapper in self.wrappers:
            wrapper.graph_pool = pool
        before = torch.cuda.memory_reserved()
        with graph_capture(self.comm):
            for wrapper in self.wrappers:
                wrapper.capture(self._dummy_run, wrapper.batch_size)
        used = torch.cuda.memory_reserved() - before
        CUDAGraphWrapper.clear_all_graphs()
        gc.collect()
        return used

    def execute_model(self, batch) -> torch.Tensor:
        self.input_ids[: batch.num_tokens].copy_(self.input_ids_cpu[: batch.num_tokens], non_blocking=True)
        wrapper = next(w for w in self.wrappers if w.batch_size >= batch.num_tokens)
        wrapper.graph.replay()  # the captured decode step
        logits = torch.empty(batch.num_seqs, self.config.vocab_size, dtype=torch.float32, device=self.device)
        return logits


class SpeculativeModelRunner(GPUModelRunner):
    def __init__(self, config: EngineConfig, device: torch.device):
        super().__init__(config, device)
        self.draft_tokens = torch.zeros(config.max_num_seqs, 4, dtype=torch.int64, device=device)
