"""What a construction allocates: the first device allocation a call's
construction (or factory) makes. Shared by snapshot-before-construction
and retained-per-entry-alloc."""

from __future__ import annotations

from ...model import Call
from ...pipeline.index import Func, Hop, ProjectIndex, Reach, last_name


def constructed_allocation(index: ProjectIndex, func: Func, call: Call, depth: int,
                           objects_only: bool = False) -> Reach | None:
    """The first device allocation a call's construction (or factory) makes.
    With ``objects_only``, factories count only when what they return is an
    object they construct (`build_runner()` returning `Runner(...)`)."""
    cls = index.constructed_class(func, call)
    if cls is not None:
        return index.class_allocates(cls, depth)
    for target in index.resolve(func, call):
        if target is func:
            continue
        found = index.factory_allocation(target, depth)
        if found is None:
            continue
        if objects_only and not any(_is_constructor(index, hop) for hop in found.hops):
            continue
        return found
    return None


def _is_constructor(index: ProjectIndex, hop: Hop) -> bool:
    callee = hop.callee
    leaf = last_name(callee)
    return leaf in ("__init__", "__post_init__") or (
        "::" in callee and callee.rsplit("::", 1)[0].rsplit("::", 1)[-1] == leaf)
