"""Allocations in a kernel registered only for the CPU device are host
memory, not device sites: the body of a function decorated
``@register_kernel("ns::op", "cpu")`` (``torch.library.register_kernel``,
or a project's wrapper of that name, also with ``device_types="cpu"``) or
``@torch.library.impl(lib, "op", "CPU")``. The dispatcher calls it only for
CPU inputs, so ``torch.empty(..., device=A.device)`` in it is on the host.
A kernel registered for several devices (``("cpu", "cuda")``) or for any
other one keeps its sites. Part of the Python extractor
(``python_sites.py``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .python import PythonExtractor

# the last argument of the decorator call is the one device key "cpu" / "CPU"
_HOST_KERNEL = re.compile(
    r"""^@\s*(?:[\w.]+\.)?(?:register_kernel|impl)\(.*["'](?:cpu|CPU)["']\s*,?\s*\)\s*$""", re.S)


def may_have_host_kernels(source: bytes) -> bool:
    """The cheap gate for ``in_host_kernel``."""
    return b"register_kernel" in source or b"\"CPU\"" in source or b"'CPU'" in source


def in_host_kernel(ext: PythonExtractor, node: Any) -> bool:
    """Whether ``node`` lies in a function registered only for the CPU."""
    parent = node.parent
    while parent is not None:
        if parent.type == "function_definition":
            holder = parent.parent
            if holder is not None and holder.type == "decorated_definition":
                for child in holder.children:
                    if child.type == "decorator" and _HOST_KERNEL.match(ext.src.text(child, 300).strip()):
                        return True
        parent = parent.parent
    return False
