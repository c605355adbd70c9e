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

Round 26 (the dominance rule: weights over the process buffers a layer
also makes): a module constructor also makes weights when it keeps on
``self`` what a loader reads from the checkpoint (``self.o_proj =
RowLinear.load(config, prefix, weights)``, ``self.scales =
weights.get_tensor(name)``: a ``checkpoint-read`` call, or a function that
returns what it reads, ``checkpoint_reads``' depth down). A derived site
that calls a function returning checkpoint tensors it reads
(``get_kv_scales(weights, prefix)``) or a construction of a module that
makes weights (``return CausalLM(prefix, config, weights)``), or that is
handed tensors its own function read from the checkpoint (``w =
stc.get_tensor(k)`` ... ``Inner(w, b)``), holds loaded weights: T1.

Left alone: a construction re-made per step (in a loop body of its
function, or in a function that a per-step function (``rules/tiers.toml``
callers) is or reaches within two calls); a class that makes no parameter
(a trainer, a cache of buffers) or is no torch module (an optimizer making
fp32 master ``Parameter`` copies); a constructor keeping what a function
returns that reads the checkpoint but returns something else; and a module
whose parameters are sites of their own (``nn.Parameter(torch.randn(n,
device=d))``, T1 there): the independent judges of bitsandbytes and
DeepSpeed tier that construction by the buffer it keeps besides (T2),
unless the sizes are known (round 26): parameters whose literal size is
larger than the literal size of the buffer the ``via`` names dominate it
(T1); a smaller parameter, or a size not known, leaves it to the via.

A derived site whose ``via`` is itself model-resident (T1: a weight its
constructor uploads, a helper reached only from load paths) is T1 too,
with the same per-step exceptions: the weight it allocates is what calling
it costs (``weighted_vias``, run once the direct tiers are final). So is a
call of a function (no constructor) that uploads weights itself (a
whole-module move or a checkpoint upload in its own body, "weight
upload") whatever its via names (what it returns: a pipeline object built
around the model): the weights dominate (round 26). Pure: sites in, sites
out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Call, Language, Site, SiteKind, Span, Tier
from .checkpoint_reads import CheckpointReader
from .default_device import is_module
from .index import ClassInfo, Func, ProjectIndex, last_name
from .module_classes import external_module_base
from .retier import Decision, retier

# a call that makes a parameter of the object being built
PARAMETER = re.compile(r"(?:\w+\.)*(?:Parameter|register_parameter)")
# a torch layer that holds weights (by its torch name: a project class of the same name is resolved instead)
LAYER = re.compile(r"(?:torch\.)?nn\.(?:Linear|Bilinear|LazyLinear|Embedding(?:Bag)?|Conv(?:Transpose)?[123]d"
                    r"|LSTM|GRU|RNN|MultiheadAttention)")
_DEPTH = 3
_UPLOAD = "weight upload"  # the reason of a whole-module move or a checkpoint tensor's upload (T1)
_STEP_DEPTH = 2


def weight_module_constructions(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    """Derived Python sites that construct a class making parameters: T1."""
    built_once = _not_per_step(index, globs)
    memo: dict[str, str] = {}
    modules: dict[str, bool] = {}
    reader = CheckpointReader(index, globs)

    def module(cls: ClassInfo) -> bool:
        return is_module(index, cls.qualname, cls.bases, modules) or external_module_base(index, cls.bases)

    walk = _Walk(index, memo, module, reader)

    def weights(ctor: Func) -> str:
        owner = ctor.owner
        return _makes_weights(ctor, walk, 0) if owner is not None and module(owner) else ""

    def decide(site: Site) -> Decision | None:
        found = built_once(site)
        if found is None:
            return None
        func, call = found
        handed = reader.handed(func, call)
        if handed:
            return Tier.T1, (f"{site.api} is handed checkpoint tensors {func.qualname} reads ({handed}): "
                             f"it holds loaded weights (was: {site.tier_reason})")
        for ctor in index.resolve(func, call):
            if ctor.name != "__init__" or ctor.owner is None:
                how = _loader(ctor, index, reader, weights)
                if how:
                    return Tier.T1, (f"{site.api} {how}: model weights, whoever calls it (was: {site.tier_reason})")
                continue
            how = weights(ctor) or _larger_parameters(ctor, site)
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
    uploads: dict[tuple[str, str], Site] = {}  # per function: its first weight upload
    for s in weights.values():
        if s.tier_reason.startswith(_UPLOAD):
            uploads.setdefault((s.path, s.scope), s)
    built_once = _not_per_step(index, globs)

    def decide(site: Site) -> Decision | None:
        via = site.via
        under = weights.get((via.path, via.line, via.api)) if via is not None else None
        found = built_once(site)
        if found is None:
            return None
        if under is not None:
            return Tier.T1, (f"{site.api} allocates weights ({under.path}:{under.span.line} is model-resident: "
                             f"{under.tier_reason}); was: {site.tier_reason}")
        func, call = found
        upload = next((u for f in index.resolve(func, call) if f.name != "__init__"
                       and (u := uploads.get((f.path, f.qualname))) is not None), None)
        if upload is None:
            return None
        return Tier.T1, (f"{site.api} uploads weights itself ({upload.api} at {upload.path}:{upload.span.line}: "
                         f"{upload.tier_reason}), which dominate what it returns; was: {site.tier_reason}")

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


@dataclass
class _Walk:
    index: ProjectIndex
    memo: dict[str, str]
    module: Callable[[ClassInfo], bool]
    reader: CheckpointReader


def _makes_weights(func: Func, walk: _Walk, depth: int) -> str:
    """How ``func`` (a constructor, or a method it calls) makes parameters
    or keeps loaded weights, or ""."""
    memo, index = walk.memo, walk.index
    found = memo.get(func.id)
    if found is not None:
        return found
    memo[func.id] = ""  # a cycle makes nothing
    how = ""
    for call in func.calls:
        callee = call.callee
        if LAYER.fullmatch(callee) or (PARAMETER.fullmatch(callee) and not _own_site(func, call.span)):
            how = f"{func.qualname} calls {callee}"
            break
        loaded = _kept_load(func, call, walk)
        if loaded:
            how = f"{func.qualname} keeps in {call.target} what {loaded}"
            break
        if depth >= _DEPTH:
            continue
        for callee_func in index.resolve(func, call):
            owner = callee_func.owner
            if owner is None or not (owner is func.owner or callee_func.name == "__init__" and walk.module(owner)):
                continue
            if _makes_weights(callee_func, walk, depth + 1):
                step = f"calls {callee_func.qualname}" if owner is func.owner else f"builds {owner.name}"
                how = f"{func.qualname} {step}, which makes parameters"
                break
        if how:
            break
    memo[func.id] = how
    return how


def _kept_load(func: Func, call: Call, walk: _Walk) -> str:
    """The call reads checkpoint tensors (itself, or through loaders that
    return what they read, ``checkpoint_reads``' depth down) and the
    constructor keeps its result on the object (``self.o_proj = RowLinear.load(config,
    prefix, weights)``, ``self.scales = weights.get_tensor(name)``): the
    module holds loaded weights. How, or ""."""
    if not call.target or not call.target.startswith("self."):
        return ""
    if walk.reader.call(call.callee):
        return f"{call.callee} reads from the checkpoint"
    for target in walk.index.resolve(func, call):
        read = walk.reader.returned(target)
        if read:
            return f"{call.callee} loads from the checkpoint ({read})"
    return ""


def _loader(func: Func, index: ProjectIndex, reader: CheckpointReader, weights: Callable[[Func], str]) -> str:
    """A function that returns what it reads from the checkpoint
    (``return KVScales(weights.get_tensor(k), ...)``) or a construction of
    a module whose constructor makes or loads weights (``return
    CausalLM(prefix, config, weights)``): what calling it allocates is model
    weights. How, or ""."""
    read = reader.returned(func)
    if read:
        return f"returns checkpoint tensors it reads ({read})"
    lines = {r.line for r in func.returns}
    for call in func.calls:
        if call.span.line not in lines:
            continue
        for ctor in index.resolve(func, call):
            if ctor.name == "__init__" and ctor.owner is not None and (how := weights(ctor)):
                return f"returns a {ctor.owner.name}, whose constructor makes weights ({how})"
    return ""


def _larger_parameters(ctor: Func, site: Site) -> str:
    """The constructor wraps storage of its own in parameters
    (``nn.Parameter(torch.randn(1024, 1024, device=d))``) whose literal size
    is larger than the literal size of what ``site``'s via keeps besides
    (``torch.randn(32, device=d)``): by the dominance rule (persistent, then
    the largest known size) the construction is its weights. Unknown sizes
    on either side leave the construction to its via. How, or ""."""
    via = site.via
    kept = next((s for s in ctor.sites if via is not None and s.via is None and s.path == via.path
                 and s.span.line == via.line), None)
    small = _elements(kept.shape) if kept is not None else None
    if kept is None or small is None:
        return ""
    for call in ctor.calls:
        if not PARAMETER.fullmatch(call.callee):
            continue
        for own in ctor.sites:
            n = _elements(own.shape) if own.via is None and call.span.contains(own.span) else None
            if n is not None and n > small:
                return (f"{ctor.qualname} calls {call.callee} on {own.api} at line {own.span.line}, "
                        f"{n} elements against the {small} of its {kept.api} at line {kept.span.line}")
    return ""


def _elements(shape: tuple[str, ...]) -> int | None:
    """The element count of a shape whose every dimension is an integer literal, else None."""
    if not shape or not all(d.strip().isdigit() for d in shape):
        return None
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _own_site(func: Func, span: Span) -> bool:
    """The parameter's storage is a site of its own (``nn.Parameter(torch.randn(n, device=d))``): the
    census counts the weight there, and the construction is judged by what its ``via`` keeps."""
    return any(span.contains(site.span) for site in func.sites if site.via is None)
