"""Stage 5, after the derived sites: constructing a Python torch module
whose constructor makes weights is a weight upload (issue 11, round 22; the
Python side of ``native_modules``).

A derived site that constructs a project torch module (a class deriving
from ``nn.Module`` or a library ``*Module``) holds a model's weights when
its constructor builds a torch layer that holds weights (``nn.Linear``,
``nn.Embedding``, ``nn.Conv2d``, ...), calls ``nn.Parameter(...)`` /
``register_parameter`` on storage that is no site of its own (a tensor a
method returns, one made without a device), or, up to three constructors
down, builds a torch module that does (``self.mlp = MLP(...)``,
``super().__init__(...)``, a method of its own class called from it:
``self.reset_parameters()``). Building it is model-resident (T1), whoever
builds it (a test's ``setup_method``, a ``get_model``, a script's
``main``), not the T2 of the constructor's buffer that its ``via`` names
(often bookkeeping) nor the T4 of a function's temporary.

Left alone: a construction re-made per step (in a loop body of its
function, or in a function that a per-step function (``rules/tiers.toml``
callers) is or reaches within two calls); a class that makes no parameter
(a trainer, a cache of buffers) or is no torch module (an optimizer making
fp32 master ``Parameter`` copies); and a module whose parameters are sites
of their own (``nn.Parameter(torch.randn(n, device=d))``, T1 there): the
independent judges of bitsandbytes and DeepSpeed tier that construction by
the buffer it keeps besides (T2).

A derived site whose ``via`` is itself model-resident (T1: a weight its
constructor uploads, a helper reached only from load paths) is T1 too,
with the same per-step exceptions: the weight it allocates is what calling
it costs (``weighted_vias``, run once the direct tiers are final). Pure:
sites in, sites out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Call, Language, Site, SiteKind, Span, Tier
from .default_device import is_module
from .index import ClassInfo, Func, ProjectIndex, last_name
from .module_classes import external_module_base
from .retier import Decision, retier

# a call that makes a parameter of the object being built
_PARAMETER = re.compile(r"(?:\w+\.)*(?:Parameter|register_parameter)")
# a torch layer that holds weights (by its torch name: a project class of the same name is resolved instead)
_LAYER = re.compile(r"(?:torch\.)?nn\.(?:Linear|Bilinear|LazyLinear|Embedding(?:Bag)?|Conv(?:Transpose)?[123]d"
                    r"|LSTM|GRU|RNN|MultiheadAttention)")
_DEPTH = 3
_STEP_DEPTH = 2


def weight_module_constructions(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    """Derived Python sites that construct a class making parameters: T1."""
    built_once = _not_per_step(index, globs)
    memo: dict[str, str] = {}
    modules: dict[str, bool] = {}

    def module(cls: ClassInfo) -> bool:
        return is_module(index, cls.qualname, cls.bases, modules) or external_module_base(index, cls.bases)

    def decide(site: Site) -> Decision | None:
        found = built_once(site)
        if found is None:
            return None
        func, call = found
        for ctor in index.resolve(func, call):
            if ctor.name != "__init__" or ctor.owner is None or not module(ctor.owner):
                continue
            how = _makes_weights(ctor, index, memo, module, 0)
            if how:
                return Tier.T1, (f"constructs {site.api}, whose constructor makes weights ({how}): model weights, "
                                 f"whoever builds it (was: {site.tier_reason})")
        return None

    return retier(sites, _eligible, decide)


def weighted_vias(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    """Derived Python sites (T2/T4) whose ``via`` is a model-resident direct site: T1. Run once the
    direct tiers are final (after ``weight_members``)."""
    weights = {(s.path, s.span.line, s.api): s for s in sites
               if s.via is None and s.tier is Tier.T1 and s.kind is SiteKind.DEVICE}
    if not weights:
        return list(sites)
    built_once = _not_per_step(index, globs)

    def decide(site: Site) -> Decision | None:
        via = site.via
        under = weights.get((via.path, via.line, via.api)) if via is not None else None
        if under is None or built_once(site) is None:
            return None
        return Tier.T1, (f"{site.api} allocates weights ({under.path}:{under.span.line} is model-resident: "
                         f"{under.tier_reason}); was: {site.tier_reason}")

    return retier(sites, _eligible, decide)


def _eligible(site: Site) -> bool:
    return (site.via is not None and site.language is Language.PYTHON and site.kind is SiteKind.DEVICE
            and site.tier in (Tier.T2, Tier.T4))


def _not_per_step(index: ProjectIndex, globs: CallerGlobs) -> Callable[[Site], tuple[Func, Call] | None]:
    """The site's function and call, unless the call is re-made per step: in a loop body of its function,
    or in a function a per-step function is or reaches within two calls."""
    per_step = matcher(globs.per_step) if globs.per_step else None
    stepped: dict[str, bool] = {}

    def check(site: Site) -> tuple[Func, Call] | None:
        found = index.site_call(site)
        if found is None:
            return None
        func, call = found
        if last_name(call.callee) != site.api or \
                any(b.kind == "loop" and b.span.contains_line(call.span.line) for b in func.blocks):
            return None
        if per_step is not None:
            if func.id not in stepped:
                stepped[func.id] = any((c := index.funcs.get(fid)) is not None and per_step(c.name)
                                       for fid in index.callers_within([func], _STEP_DEPTH))
            if stepped[func.id]:
                return None
        return found

    return check


def _makes_weights(func: Func, index: ProjectIndex, memo: dict[str, str], module: Callable[[ClassInfo], bool],
                   depth: int) -> str:
    """How ``func`` (a constructor, or a method it calls) makes parameters, or ""."""
    found = memo.get(func.id)
    if found is not None:
        return found
    memo[func.id] = ""  # a cycle makes nothing
    how = ""
    for call in func.calls:
        callee = call.callee
        if _LAYER.fullmatch(callee) or (_PARAMETER.fullmatch(callee) and not _own_site(func, call.span)):
            how = f"{func.qualname} calls {callee}"
            break
        if depth >= _DEPTH:
            continue
        for callee_func in index.resolve(func, call):
            owner = callee_func.owner
            if owner is None or not (owner is func.owner or callee_func.name == "__init__" and module(owner)):
                continue
            if _makes_weights(callee_func, index, memo, module, depth + 1):
                step = f"calls {callee_func.qualname}" if owner is func.owner else f"builds {owner.name}"
                how = f"{func.qualname} {step}, which makes parameters"
                break
        if how:
            break
    memo[func.id] = how
    return how


def _own_site(func: Func, span: Span) -> bool:
    """The parameter's storage is a site of its own (``nn.Parameter(torch.randn(n, device=d))``): the
    census counts the weight there, and the construction is judged by what its ``via`` keeps."""
    return any(span.contains(site.span) for site in func.sites if site.via is None)
