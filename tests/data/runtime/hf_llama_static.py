"""A third-party run for `alloc-audit join`: a randomly initialised Hugging
Face Llama (built from a config, nothing downloaded) generating a few tokens
with a static KV cache, under `python -m alloc_audit.record`. The model is
built in bf16 under a device context (weights are allocated where the
modules create them), the cache is kept alive so the snapshot holds it, and
each decode step is marked (`phase=serve;step=N`) through a logits processor.

    python -m alloc_audit.record --out snaps -- hf_llama_static.py
"""

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

from alloc_audit.record import mark


class StepMarker(LogitsProcessor):
    """Called once per generated token: tags what the next step allocates."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        mark(f"phase=serve;step={self.step}")
        self.step += 1
        return scores


print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=4, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
mark("phase=load")
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    MODEL = LlamaForCausalLM(config).eval()
torch.set_default_dtype(torch.float32)
prompt = torch.randint(3, config.vocab_size, (2, 24), device="cuda")
try:
    from transformers import StaticCache

    CACHE = StaticCache(config=config, max_cache_len=64)
    cache_args = {"past_key_values": CACHE}
except Exception as exc:  # another transformers version: let generate build it
    print("StaticCache not built here:", exc, flush=True)
    cache_args = {"cache_implementation": "static"}
mark("phase=prefill")
with torch.inference_mode():
    OUT = MODEL.generate(prompt, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt),
                         logits_processor=LogitsProcessorList([StepMarker()]), **cache_args)
torch.cuda.synchronize()
print("generated", tuple(OUT.shape), flush=True)
mark("phase=end")
