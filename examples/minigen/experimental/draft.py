"""Work in progress: a prefix-cache buffer. Half-edited on purpose, as a
pre-commit hook sees files: the signature below is not finished. The parser
recovers and the site is still reported, but inside the broken region its
enclosing scope cannot be told for sure, so its tier is `unknown`."""

import torch


def build_prefix_cache(num_blocks, device, dtype=
    cache = torch.zeros(num_blocks, 16, 128, dtype=torch.bfloat16, device=device)
    return cache
