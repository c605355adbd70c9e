"""A test file that declares it needs no GPU and never names a device runs
on the host: in a file named ``test_*.py`` that declares ``NUM_GPUS = 0`` at
module level (the CI resource declaration of a test file) and whose text never
says ``cuda``/``gpu`` (``NUM_GPUS`` aside), never moves a tensor
(``.to(`` other than ``.to(dtype=...)``, ``.cuda(``), never builds or sets a device (``torch.device(``,
``set_default_device``, ``accelerator``) and whose every ``device=`` copies
another tensor's (``device=x.device``), every tensor starts on the host, so
a copy of one (``torch.zeros_like(x)``, ``x.new_zeros(n)``, ``device=x.device``)
is host memory, not a device site. A file that imports a test helper module
(a relative import, ``conftest``, ``tests.``) may get device tensors from it
and keeps its sites. Without the declaration a test file keeps its sites:
a framework call (``deepspeed.initialize``) or a fixture may move its
tensors without naming a device in the file. Read once per file, from the bytes, with
one compiled pattern. Part of the Python extractor (``python_sites.py``).

A file of any name that loads its tensors on the host itself (a loader
call given the host: ``load_state_dict(path, device="cpu")``,
``torch.load(f, map_location="cpu")``), defines no ``forward`` (a model's
inputs arrive on the device) and otherwise names no device in the same
sense (casts such as
``.to(torch.bfloat16)`` allowed; relative imports allowed, they are the
package's own code) works on host tensors too: a checkpoint or adapter
converter. Its copies are host memory.

A file that hides every GPU when imported (module level
``os.environ["CUDA_VISIBLE_DEVICES"] = ""``, round 26) and names no other
accelerator allocates host memory only: none of its allocations is a site."""

from __future__ import annotations

import re

# the file declares it needs no GPU (a CI resource declaration: `NUM_GPUS = 0`)
_NO_GPUS = re.compile(rb"^NUM_GPUS[ \t]*=[ \t]*0[ \t]*$", re.M)
_DEVICE_WORDS = re.compile(
    rb"cuda|gpu(?<!NUM_GPU)|\.to\((?!dtype=)|torch\.device\(|set_default_device|accelerator"
    rb"|\b(?:xpu|npu|mps|hpu)\b|device\s*=(?!=)(?!\s*[A-Za-z_]\w*\.device\b)"
    # a test helper module may hand out device tensors (`from .common import make_inputs`)
    rb"|^[ \t]*from[ \t]+(?:\.|conftest\b|tests?\.)|^[ \t]*import[ \t]+(?:conftest|tests?)\b", re.I | re.M)


def host_test_file(path: str, source: bytes) -> bool:
    """Whether ``path`` is a test file that never names a device (see the module text)."""
    if not path.rpartition("/")[2].startswith("test_") or _NO_GPUS.search(source) is None:
        return False
    return _DEVICE_WORDS.search(source) is None


# the file loads tensors onto the host itself: a loader call given `device="cpu"` /
# `map_location="cpu"` (`load_state_dict(path, device="cpu")`, `torch.load(f, map_location="cpu")`)
_CPU_LOAD = re.compile(rb"""(?:\bload\w*|safe_open)\([^()]*\b(?:device|map_location)[ \t]*=[ \t]*["']cpu["']""")
# ... and names no other device, and defines no `forward` (a model's inputs come on the device)
_OTHER_DEVICE_WORDS = re.compile(
    rb"cuda|gpu|\.to\((?!dtype=|torch\.\w+\))|\.cuda\(|torch\.device\(|set_default_device|accelerator"
    rb"|\bdef[ \t]+forward\b"
    rb"|\b(?:xpu|npu|mps|hpu)\b"
    rb"""|(?:device|map_location)\s*=(?!=)(?!\s*[A-Za-z_]\w*\.device\b)(?!\s*["']cpu["'])""", re.I)


def host_loaded_file(source: bytes) -> bool:
    """Whether the file loads its tensors on the host and names no other
    device (see the module text)."""
    if b"cpu'" not in source and b'cpu"' not in source:
        return False  # _CPU_LOAD ends in a quoted "cpu": most files are ruled out without a search
    return _CPU_LOAD.search(source) is not None and _OTHER_DEVICE_WORDS.search(source) is None


# a module-level statement hiding every CUDA device from the process (round 26)
_HIDES_GPUS = re.compile(rb"""^os\.environ\[\s*["']CUDA_VISIBLE_DEVICES["']\s*\][ \t]*=[ \t]*"""
                         rb"""["'](?:-1)?["'][ \t]*(?:#.*)?$""", re.M)
_OTHER_ACCELERATORS = re.compile(rb"\b(?:xpu|npu|mps|hpu|xla|tpu)\b", re.I)


def gpus_hidden_file(source: bytes) -> bool:
    """Whether the file hides every GPU at import (a module-level
    ``os.environ["CUDA_VISIBLE_DEVICES"] = ""`` or ``"-1"``) and names no
    other accelerator: what it allocates is host memory (a test pinned to
    the CPU that way); a file testing another accelerator with CUDA hidden
    keeps its sites."""
    if b"CUDA_VISIBLE_DEVICES" not in source:
        return False
    return _HIDES_GPUS.search(source) is not None and _OTHER_ACCELERATORS.search(source) is None
