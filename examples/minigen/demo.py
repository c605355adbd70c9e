"""Run minigen for real on one GPU: torch only, a few MB of random weights,
no downloads. The engine goes through the life of a serving process: bring
up the device (and measure it too early), load weights, profile the graph
memory with throwaway graphs, size the KV pool from what is free, capture the
decode step, serve a few steps. Phases and steps are marked in the memory
record through user metadata where the torch version supports it.

    cd examples && python -m minigen.demo --snapshot minigen.pickle
    cd examples && python -m alloc_audit.record --out snaps -- -m minigen.demo

The hazards it runs into on purpose, one of each kind a memory record shows:
allocations executed under capture (``_dummy_run``, ``forward``,
``sparse_attention``), a measurement taken before buffers that were then
allocated (``Worker.init_device``), per-step allocations in the serving
loop (``execute_model``), a scratch buffer that grows and stays alive
(``ScratchPlan.overflow``), and a throwaway graph pool
(``profile_cudagraph_memory``).
"""

import argparse
import os
from dataclasses import dataclass

import torch

from .config import EngineConfig
from .worker import Worker


@dataclass
class Batch:
    num_tokens: int
    num_seqs: int


def mark(text: str) -> None:
    """Tag the allocations that follow in the memory record (torch >= 2.9)."""
    setter = getattr(torch.cuda.memory, "_set_memory_metadata", None)
    if setter is not None:
        setter(text)


def small_config() -> EngineConfig:
    return EngineConfig(
        max_num_tokens=256, max_num_seqs=8, hidden_size=256, num_layers=4, num_kv_heads=2, head_dim=64,
        vocab_size=4096, gpu_memory_utilization=0.0002, cudagraph_batch_sizes=(1, 2, 4, 8),
    )


def run_native(worker: Worker) -> None:
    """Build csrc/ as a torch extension and run its native allocations: a
    device arena (cudaMalloc, cudaMallocAsync, cudaHostAlloc,
    cudaMallocManaged) that grows once and is kept, and a libtorch op."""
    from torch.utils.cpp_extension import load

    source = os.path.join(os.path.dirname(__file__), "csrc", "demo_bindings.cu")
    stubs = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64", "stubs")  # cuMem* live in libcuda
    # no inlining: the native frames must name the functions that allocate
    ext = load("minigen_native", [source], extra_cflags=["-O0"], extra_cuda_cflags=["-O0", "-Xcompiler", "-fno-inline"],
               extra_ldflags=[f"-L{stubs}", "-lcuda"])
    mark("phase=native")
    ext.run_native(1 << 20)
    worker.native_out = ext.fused_gate(worker.model_runner.inputs_embeds)


def run(steps: int) -> Worker:
    worker = Worker(small_config())
    mark("phase=init")
    worker.init_device()
    runner = worker.model_runner
    mark("phase=load")
    worker.load_model()
    mark("phase=warmup")
    runner._dummy_run(8)
    mark("phase=profile")
    runner.profile_cudagraph_memory()
    mark("phase=kv")
    worker.initialize_cache()
    mark("phase=capture")
    runner.capture_model()
    for step in range(steps):
        mark(f"phase=serve;step={step}")
        batch = Batch(num_tokens=1 + step % 8, num_seqs=1 + step % 8)
        runner.input_ids_cpu[: batch.num_tokens].fill_(step)
        worker.execute_model(batch)
        if step % 4 == 3:  # a long request: the overflow buffer grows and stays
            runner.scratch.overflow(4096 * (step + 1))
    torch.cuda.synchronize()
    mark("phase=end")
    return worker


def main(argv=None) -> Worker:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--snapshot", help="record memory history and dump a snapshot here (without alloc-audit)")
    parser.add_argument("--native", action="store_true", help="also build and run the native side (csrc/)")
    args = parser.parse_args(argv)
    if args.snapshot:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=100_000)
    worker = run(args.steps)
    if args.native:
        run_native(worker)
    if args.snapshot:
        torch.cuda.memory._dump_snapshot(args.snapshot)
    return worker


if __name__ == "__main__":
    # kept at module level: a recorder that dumps after the program sees it alive
    ENGINE = main()
