"""Constructions that allocate no device memory (issue 11, round 35b);
part of the Python extractor (``python_sites.make_site``, ``builds_nothing``).

- A ``torch.nn`` normalisation layer built with its affine weights off and
  no running statistics holds no tensor: ``nn.LayerNorm(d,
  elementwise_affine=False)`` and ``nn.RMSNorm(d, elementwise_affine=False)``,
  ``nn.GroupNorm(g, c, affine=False)``, an ``nn.InstanceNorm*d`` without
  ``affine=`` / ``track_running_stats=`` (both off by default, so
  ``nn.InstanceNorm2d(c)``) or with both ``False``, an ``nn.BatchNorm*d``
  given ``affine=False`` and ``track_running_stats=False``. Building it on a
  device makes nothing there. Only the literal ``False`` (or, for instance
  norm, no keyword) counts: ``elementwise_affine=affine``, a positional
  flag, ``**kw`` or any other layer stays a weight site.
- ``torch.tensor(S, dtype=d, device=x.device)`` (or ``as_tensor`` /
  ``asarray``), ``S`` a local of the function every binding of which (one
  at least, above the call) is the storage of one tensor ``x``
  (``x.untyped_storage()``, ``x.storage()._untyped()``,
  ``x.storage().untyped()``; the ``try``/``except`` pair of the older and
  newer spelling), and no device or ``x``'s own: PyTorch builds a tensor
  over a storage with ``set_``, a view of the memory ``x`` holds. A storage
  written in place (``torch.tensor(x.untyped_storage())``) is read the
  same way. A parameter ``S``, a binding to anything else, another device
  or ``copy=True`` keeps the site (``python_same_device.storage_alias``
  reads ``as_tensor`` of a storage written in place).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ...model import Arg
from .common import enclosing

if TYPE_CHECKING:
    from .python import PythonExtractor

_NORMS = re.compile(r"torch\.nn\.(LayerNorm|RMSNorm|GroupNorm|InstanceNorm[123]d|BatchNorm[123]d)")
_WRAPS = frozenset({"torch.tensor", "torch.as_tensor", "torch.asarray"})
# the storage of the tensor `x`: `x.untyped_storage()`, `x.storage()._untyped()`, `x.storage().untyped()`
_STORAGE = r"(.+?)\s*\.\s*(?:untyped_storage\(\s*\)|(?:storage|_typed_storage)\(\s*\)\s*\.\s*_?untyped\(\s*\))"
_STORAGE_OF = re.compile(_STORAGE)
_IDENT = re.compile(r"[A-Za-z_]\w*")


def builds_nothing(ext: PythonExtractor, node: Any, api: str, positional: list[str], kwargs: dict[str, str],
                   args: tuple[Arg, ...]) -> bool:
    """A norm layer that holds no tensor, or a tensor over a storage another tensor holds."""
    if api.startswith("torch.nn."):
        return affine_off(api, kwargs, any(a.text.startswith("**") for a in args))
    return ext.storage_file and storage_view(ext, node, api, positional, kwargs)


def affine_off(api: str, kwargs: dict[str, str], spread: bool) -> bool:
    """A torch norm layer built with no weight, bias or running statistics."""
    m = _NORMS.fullmatch(api)
    if m is None or spread:
        return False
    layer = m.group(1)

    def off(key: str, default: bool = False) -> bool:
        value = kwargs.get(key)
        return default if value is None else value.strip() == "False"

    if layer in ("LayerNorm", "RMSNorm"):
        return off("elementwise_affine")
    if layer == "GroupNorm":
        return off("affine")
    if layer.startswith("InstanceNorm"):
        return off("affine", True) and off("track_running_stats", True)
    return off("affine") and off("track_running_stats")


def may_wrap_storage(source: bytes) -> bool:
    """The cheap gate for ``storage_view``."""
    return b"storage()" in source


def storage_view(ext: PythonExtractor, node: Any, api: str, positional: list[str],
                 kwargs: dict[str, str]) -> bool:
    """``torch.tensor(S, device=x.device)`` of a local ``S`` bound only to ``x``'s storage: a view."""
    if api not in _WRAPS or len(positional) != 1 or kwargs.get("copy", "False").strip() not in ("False", "None"):
        return False
    if not set(kwargs) <= {"dtype", "device", "copy", "requires_grad"}:
        return False
    arg = positional[0].strip()
    found = _STORAGE_OF.fullmatch(arg)
    if found is not None:
        roots = {found.group(1).strip()}
    elif _IDENT.fullmatch(arg):
        roots = _bound_storages(ext, node, arg)
    else:
        return False
    if len(roots) != 1:
        return False
    device = kwargs.get("device")
    return device is None or device.strip() == f"{next(iter(roots))}.device"


def _bound_storages(ext: PythonExtractor, node: Any, name: str) -> set[str]:
    """The tensors whose storage every binding of ``name`` in the function holds (empty: unproven)."""
    body = enclosing(node.parent, "function_definition")
    if body is None:
        return set()
    text = ext.src.data[body.start_byte:node.start_byte].decode("utf-8", "replace")
    after = ext.src.data[node.start_byte:body.end_byte].decode("utf-8", "replace")
    params = body.child_by_field_name("parameters")
    if params is None or re.search(rf"\b{re.escape(name)}\b", ext.src.text(params, 2000)):
        return set()  # a parameter
    binds = re.compile(rf"(?<![\w.])(?:{re.escape(name)})\s*(?::[^=\n]+)?=(?!=)\s*([^\n]+)")
    roots: set[str] = set()
    for value in binds.findall(text):
        found = _STORAGE_OF.fullmatch(value.strip())
        if found is None:
            return set()
        roots.add(found.group(1).strip())
    if not roots or binds.search(after) or re.search(rf"\bfor\s+[^\n]*\b{re.escape(name)}\b\s*[,\sin]", text + after):
        return set()
    if re.search(rf"\b(?:as|global|nonlocal)\s+{re.escape(name)}\b|\b{re.escape(name)}\s*(?:[-+*/|&]=|:=)",
                 text + after):
        return set()
    return roots
