"""Stage 5, after the callers' tiers: the temporaries of a function that
initialises a module's weights are load-time (issue 11, round 13; the
judges' convention: creating or initialising an adapter or a layer's weights
is a load path, and load-time device temporaries are T1).

An initialiser by name (``init``, ``init_*``, ``*_init``, ``initialize_*``:
``rules/tiers.toml``) whose own code works on weights, because it reads a
``.weight`` attribute (``lora_A = module.lora_A[name].weight``) or takes a
parameter named like one (``weight``, ``weights``, ``*_weight``:
``loftq_init(weight, ...)``), is a weight initialiser like
``init_weights``. The device buffers it drops (a local, or a value handed
to a call: ``lora_B = lora_B.to(lora_A.device)`` passed to
``update_layer``) live only while the weights are made: T1. What it keeps
on its object or returns is left to the other rules; an initialiser that a
per-step function reaches (2 calls up) stays per call, and so does one
that reads no weight (a process group's ``init_*`` and its barrier
tensor). Test code is left alone: the name patterns do not apply there.
Constructors are left alone too: the judges disagree on their temporaries
(a rotary table's ``arange`` in a model's ``__init__`` is T4 for some,
token ids moved to compute a new embedding's first weights T1 for others),
and a constructor that takes ``weights`` is often handed a weight loader.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..catalog import CallerGlobs
from ..globs import matcher, test_path
from ..model import Site, Tier
from .index import Func, ProjectIndex
from .retier import Decision, python_device_site, retier

_INITIALISER = "initialiser "  # the reason of the initialiser-name patterns (rules/tiers.toml)
_DROPPED = "; a temporary (not kept, returned or handed on): the pattern for T2 does not apply"  # classify.py
_READS_WEIGHT = re.compile(r"\.weight\b(?!\s*=[^=])")
_WEIGHT_PARAM = re.compile(r"(?:\w+_)?weights?")
# a name read as a tensor or module: an attribute or an index of it (`weight.shape`,
# `weight.copy_(...)`, `weights[i]`)
_ATTR_OR_INDEX = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*[.\[]")
# a bare name in an argument list (not a keyword's name)
_ARG_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\b(?![ \t]*(?:=[^=]|[.\[(]))")
_STEP_DEPTH = 2


def weight_init_temporaries(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    per_step = matcher(globs.per_step) if globs.per_step else None
    known: dict[str, str] = {}

    def eligible(site: Site) -> bool:
        if not python_device_site(site, Tier.T2, Tier.T4) or test_path(site.path):
            return False
        dropped = site.kept in ("", "local") or site.kept.startswith("handed:")
        reason = site.tier_reason
        return dropped and (reason.startswith(_INITIALISER) if site.tier is Tier.T2 else _DROPPED in reason)

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.scope.role not in ("function", "method"):
            return None
        why = known.get(func.id)
        if why is None:
            why = known[func.id] = _weights_read(func)
            if why and per_step is not None and any(
                    d > 0 and (c := index.funcs.get(fid)) is not None and per_step(c.name)
                    for fid, d in index.callers_within([func], _STEP_DEPTH).items()):
                why = known[func.id] = ""
        if not why:
            return None
        was = site.tier_reason.removesuffix(_DROPPED)
        return Tier.T1, f"load-time: made while {func.qualname} initialises weights ({why}); was: {was}"

    return retier(sites, eligible, decide)


def _weights_read(func: Func) -> str:
    """How ``func`` works on weights (it takes one, it reads one), or ""."""
    assert func.scope is not None
    taken = [p for p in func.scope.params if _WEIGHT_PARAM.fullmatch(p)]
    if taken:
        used = _tensor_names(func)
        for p in taken:
            if p in used:
                return f"it takes {p}"
    for a in func.assigns:
        if _READS_WEIGHT.search(a.value):
            return f"it reads {a.value.strip()[:60]} at line {a.line}"
    for c in func.calls:
        if _READS_WEIGHT.search(c.arglist) or _READS_WEIGHT.search(c.callee):
            return f"it reads a .weight in {c.callee}(...) at line {c.span.line}"
    return ""


def _tensor_names(func: Func) -> set[str]:
    """The names ``func`` uses as a tensor or a module: it reads an attribute
    of one or indexes it (``weight.shape``, ``weight.copy_(...)``,
    ``weights[i] = ...``) or hands it to a torch op (``torch.matmul(weight, x)``).
    A float setting named like a weight (``similarity_weight``) that is only
    passed on or multiplied is none of these."""
    names: set[str] = set()
    for a in func.assigns:
        names.update(_ATTR_OR_INDEX.findall(a.value))
        for target in a.targets:
            names.update(_ATTR_OR_INDEX.findall(target))
    for c in func.calls:
        names.update(_ATTR_OR_INDEX.findall(c.callee))
        names.update(_ATTR_OR_INDEX.findall(c.arglist))
        if c.callee.startswith("torch."):
            names.update(_ARG_NAME.findall(c.arglist))
    return names
