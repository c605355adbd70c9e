"""Stage 3, extract (Python): copies of a value made on the default device, by
where the value is at the copy (issue 11, round 32, ``device provenance``).

Input: a ``*_like`` / ``x.new_*`` factory, or a factory given ``device=E``
(not a literal), and ``python_device_flow``'s walk of its function. Output:
whether the value it copies the device of has the ``default`` token at that
statement: made by a torch factory given no device, or by an op of such
values with numbers (a parameter annotated ``int``/``float``/``bool``/``str``
is a number), a buffer ``self.register_buffer("w", t)`` bound to one, an
``nn.Parameter`` of one. ``python_sites`` then records the factory as a
default-device site, which ``default_device`` makes a device site only where
a default-device context reaches its function; elsewhere it is a host
tensor, no site.

Rule. True: ``freqs = 1.0 / (theta ** (torch.arange(0, dim, 2).float() /
dim))`` with ``dim: int, theta: float``, then ``torch.arange(end,
device=freqs.device)``, whatever ``freqs`` is rebound to below;
``self.register_buffer("qweight", torch.zeros(n))`` then ``torch.tensor(v,
device=self.qweight.device)``. False: ``t = torch.arange(n, device=device)``
of a ``device=None`` parameter (the caller's device); ``f = scale(f)`` above
the copy; ``f`` made inside ``with torch.device("cuda"):``; ``self.to(d)``
between the buffer and the copy; an unannotated parameter in the op (it may
be a tensor); ``f.to(device)`` of a host-made ``f`` (a move, an upload: not
asked here). The walk's own rules (branches joined, loops to a fixpoint) make
a rebinding that a loop brings back, or one on one branch, unknown.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .python_device_flow import _LITERAL_DEVICE, copied_device
from .python_device_values import DEFAULT
from .python_host import default_expression, default_source

if TYPE_CHECKING:
    from .python import PythonExtractor


def default_copy(ext: PythonExtractor, node: Any, like: bool) -> bool:
    """Round 32: the ``*_like`` (``like``: its first argument) or ``x.new_*`` (its receiver) ``node`` copies
    the device of a value the function made on the default device at that point (a factory given no
    device, an op of one; a later rebinding does not count): a default-device site, a device site only
    where a default-device context reaches (``default_device``)."""
    return copied_device(ext, node, "first" if like else "receiver") == DEFAULT


def default_device_of(ext: PythonExtractor, node: Any, device: str | None, given: str) -> bool:
    """Round 32: ``device=x.device`` (``given``) of the factory ``node`` names the device of a value the
    function made on the default device at that point: a default-device site."""
    return device != DEFAULT and _LITERAL_DEVICE.fullmatch(given.strip()) is None \
        and copied_device(ext, node, "device") == DEFAULT


def default_copied(ext: PythonExtractor, node: Any, copied: str, like: bool) -> bool:
    """The ``*_like`` / ``new_*`` ``node`` of ``copied`` is made on the default device: every binding of
    the name is (``python_host.default_source``), the expression is (``default_expression``), or, round
    32, the value is there at this point of the walk."""
    return default_source(ext, node, copied) or default_expression(ext, node, copied) \
        or default_copy(ext, node, like)


def default_given(ext: PythonExtractor, node: Any, source: re.Match[str] | None, device: str | None,
                  given: str) -> bool:
    """The factory ``node`` given ``device=given`` (``x.device`` when ``source`` matched ``x``) is made on
    the default device: every binding of ``x`` is there, or, round 32, the device named is there at this
    point of the walk."""
    return source is not None and default_source(ext, node, source.group(1)) \
        or default_device_of(ext, node, device, given)
