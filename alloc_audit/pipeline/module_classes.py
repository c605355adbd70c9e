"""Stage 5, before the tiers: a ``.to(device)`` / ``.cuda()`` on an object
built by a project class of another file that derives from ``nn.Module``
moves a whole module (a weight upload), which one file cannot tell
(``extract/python_module_move.py`` decides what the file itself shows).

Input: the sites, the index. The receiver comes from the call table: the
move's own callee text (``layer.to(dtype).to``) less its casts, then either
a construction at the same position (``UNet(**cfg).to("cuda")``) or the last
call above in the same function whose value was stored to the receiver's
name (``layer = Classifier(...)``). The class is what the index resolves,
or in a method the class itself (``cls(cfg)``) or one nested in it
(``self._Block(cfg)``, round 26). A class the index resolves and whose
bases reach ``nn.Module`` makes the site ``Module.to`` / ``Module.cuda``,
classified again; anything else is left as it is. A class the index does
not know may be defined in a file the pre-filter skipped (a model built of
``nn.Linear`` layers allocates nothing itself): ``skipped(name)`` gives the
bytes of the skipped files that mention the name, and a ``class Name(...)``
there whose bases (every definition of that name, followed through base
names up to 4 levels) reach ``Module`` counts the same; so does a class of
that name the index knows but the import did not resolve to (a re-export
through a skipped package ``__init__``). A library class built around a
module it is handed first (``Adapter(vae.encoder, ...).to(dev)``) is a
module too. Round 27: a project class whose base chain leaves the index
for a skipped file (``class Layer(EncoderLayer)``, ``EncoderLayer(LayerBase)``,
``LayerBase(nn.Module)`` skipped) is walked on through the skipped files; a
``torchmetrics`` class taken as a base is a module (every metric is one); a
call of a parameter (``module_cls(**kw).to(d)``) builds a module when every
call that may reach the function hands in, for it, a name of a module class;
a project function whose return annotation names a module class hands one
back. Round 28: a move of the function's own parameter is a module's when
every call hands in a module the caller built (``module_params.py``).
Pure, but for ``skipped``'s reads.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

from ..arglists import split_args
from ..catalog import TierPattern
from ..model import Call, FileFacts, Language, Site, Tier
from .classify import classify_sites
from .default_device import is_module
from .index import ClassInfo, Func, ProjectIndex, last_name
from .module_params import module_parameter
from .module_returns import returns_module
from .names import IDENTIFIER

_MOVES = {"Tensor.to": "Module.to", "Tensor.cuda": "Module.cuda"}
_CASTS = re.compile(r"\.(?:(?:half|float|bfloat16|double|eval|train|requires_grad_|cpu|cuda)\(\s*(?:True|False)?\s*\)"
                    r"|(?:to|cuda)\([^()]*\))$")


Skipped = Callable[[str], list[bytes]]


def module_moves(sites: Sequence[Site], index: ProjectIndex, files: Mapping[str, FileFacts],
                 patterns: Sequence[TierPattern], skipped: Skipped | None = None) -> list[Site]:
    """``sites`` with the moves of project-module objects relabelled and
    classified again."""
    memo: dict[str, bool] = {}
    text_memo: dict[str, bool] = {}
    base_memo: dict[str, bool] = {}
    param_memo: dict[str, bool] = {}
    class_memo: dict[tuple[str, str], bool] = {}
    helper_memo: dict[tuple[str, str], str] = {}
    why: dict[int, str] = {}  # the evidence a round-27 proof names, added to the reason
    moved: dict[int, Site] = {}
    params: dict[int, Site] = {}
    for i, site in enumerate(sites):
        if site.api not in _MOVES or site.via is not None or site.language is not Language.PYTHON:
            continue
        func = index.func(site.path, site.scope)
        if func is None:
            continue
        call = receiver_builder(func, site)
        if call is None:
            found = _receiver(func, site)
            handed = "" if found is None else module_parameter(
                index, func, site, found[0], lambda f, c: _builds_module(index, f, c, memo, base_memo),
                lambda leaf: _named_builder(index, leaf), _member_builder, helper_memo)
            if handed:
                moved[i], why[i] = dataclasses.replace(site, api=_MOVES[site.api]), handed
            continue
        cls = _constructed(index, func, call)
        if cls is not None:
            module = is_module(index, cls.qualname, cls.bases, memo) or _external_base(index, cls.bases, base_memo)
            if not module and skipped is not None and _bases_reach(cls.bases, index, skipped, memo, text_memo, 0):
                module, why[i] = True, f"{cls.name}'s base classes reach nn.Module through a file the index skipped"
            if not module and _external_base(index, cls.bases, param_memo, parameters=True):
                params[i] = dataclasses.replace(site, tier=Tier.T1, tier_reason=(
                    f"weight upload: {site.scope} moves a {cls.name}, a torch.nn.Parameter subclass, to the device "
                    f"(was: {site.tier_reason})"))
                continue
        else:
            leaf = last_name(call.callee)

            def builds(f: Func, c: Call) -> bool:
                return _builds_module(index, f, c, memo, base_memo)

            module = _named_builder(index, leaf) or _wraps_module(index, leaf, call) or returns_module(
                index, func, call, builds) or (
                skipped is not None and leaf[:1].isupper() and _skipped_module(leaf, index, skipped, memo, text_memo))
            if not module and returns_module(index, func, call, builds,
                                             lambda f, t: _module_annotation(index, f, t, memo, base_memo)):
                module, why[i] = True, f"{call.callee} is annotated to return a module class"
            if not module and _class_parameter(index, func, call, memo, base_memo, class_memo):
                module, why[i] = True, f"every call of {site.scope} hands a module class in for {call.callee}"
        if module:
            moved[i] = dataclasses.replace(site, api=_MOVES[site.api])
    if not moved and not params:
        return list(sites)
    again = {i: dataclasses.replace(s, tier_reason=f"{s.tier_reason} ({why[i]})") if i in why else s
             for i, s in zip(moved, classify_sites(moved.values(), files, patterns))}
    again.update(params)
    return [again.get(i, site) for i, site in enumerate(sites)]


def _builds_module(index: ProjectIndex, func: Func, call: Call, memo: dict[str, bool],
                   base_memo: dict[str, bool]) -> bool:
    """``call`` in ``func`` constructs a module: a project class whose
    bases reach ``nn.Module`` or a library layer, or a library class named
    like a layer or a model."""
    cls = _constructed(index, func, call)
    if cls is not None:
        return is_module(index, cls.qualname, cls.bases, memo) or _external_base(index, cls.bases, base_memo)
    layer = _NN_LAYER.fullmatch(call.callee)
    if layer is not None and layer.group(1) not in _NOT_LAYERS:
        return True  # `torch.nn.ModuleList()`, `nn.Sequential(...)`
    leaf = last_name(call.callee)
    return _MODULE_SUFFIX.fullmatch(leaf) is not None and not index.classes_named(leaf)


def _module_class(index: ProjectIndex, cls: ClassInfo, memo: dict[str, bool], base_memo: dict[str, bool]) -> bool:
    return is_module(index, cls.qualname, cls.bases, memo) or _external_base(index, cls.bases, base_memo)


# an annotation that names a torch module type itself (`nn.Module`, `"PreTrainedModel"`)
_MODULE_ANNOTATION = re.compile(r"(?:torch\.)?(?:nn\.)?Module|(?:transformers\.)?PreTrainedModel")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _module_annotation(index: ProjectIndex, func: Func, annotation: str, memo: dict[str, bool],
                       base_memo: dict[str, bool]) -> bool:
    """``annotation`` (a function's return type, as written) names
    ``nn.Module`` or a class deriving from it: ``-> nn.Module``, ``->
    metrics.KLDivergenceMetric`` (a project ``torchmetrics.Metric``). A
    union, an optional or a container of modules is no module."""
    text = annotation.strip().strip("\"'").strip()
    if _DOTTED.fullmatch(text) is None:
        return False
    if _MODULE_ANNOTATION.fullmatch(text) is not None:
        return True
    cls = index.class_named(func, text)
    return cls is not None and _module_class(index, cls, memo, base_memo)


_SELF_PARAMS = frozenset({"self", "cls"})


def _class_parameter(index: ProjectIndex, func: Func, call: Call, memo: dict[str, bool], base_memo: dict[str, bool],
                     class_memo: dict[tuple[str, str], bool]) -> bool:
    """``call`` calls a parameter of ``func`` (``chunk = module_cls(**kw).to(d)``)
    that ``func`` never rebinds, and every call that may reach ``func``
    (one at least, each resolved to it) hands in, by position or keyword, a
    name that resolves in the caller to a class deriving from ``nn.Module``
    (``_build(PipelineViT, depth)``): calling the class builds a module. A
    caller that passes anything else (a factory function, a parameter of its
    own, nothing: the default) keeps the site. Memoised per (function,
    parameter)."""
    scope = func.scope
    callee = call.callee.strip()
    if scope is None or not callee.isidentifier() or callee not in scope.params or callee in _SELF_PARAMS:
        return False
    key = (func.id, callee)
    found = class_memo.get(key)
    if found is None:
        found = class_memo[key] = _callers_pass_module_class(index, func, callee, memo, base_memo)
    return found


def _callers_pass_module_class(index: ProjectIndex, func: Func, param: str, memo: dict[str, bool],
                               base_memo: dict[str, bool]) -> bool:
    assert func.scope is not None
    if any(param in a.targets for a in func.assigns) or any((c.target or "").strip() == param for c in func.calls):
        return False  # rebound in the function: what is called is not what was handed in
    params = list(func.scope.params)
    position = params.index(param) - (1 if params and params[0] in _SELF_PARAMS else 0)
    reaching = index.calls_reaching(func)
    if not reaching:
        return False
    for caller, call, resolved in reaching:
        if not resolved:
            return False
        args = split_args(call.arglist)
        passed = next((a for a in args if a.keyword == param), None)
        if passed is None:  # by position, unless a `*args` splat comes first (`**kw` cannot fill a filled slot)
            positional = [a for a in args if a.keyword is None and not a.text.lstrip().startswith("**")]
            passed = positional[position] if 0 <= position < len(positional) else None
            if any(a.text.lstrip().startswith("*") for a in positional[:position + 1]):
                return False
        text = passed.text.strip() if passed is not None else ""
        if _DOTTED.fullmatch(text) is None:
            return False
        cls = index.class_named(caller, text)
        if cls is None or not _module_class(index, cls, memo, base_memo):
            return False
    return True


def _constructed(index: ProjectIndex, func: Func, call: Call) -> ClassInfo | None:
    """The project class ``call`` in ``func`` constructs: what the index
    resolves, or, in a method, the class it sits in (``cls(cfg)``,
    ``type(self)(cfg)``, ``self.__class__(cfg)``: that class or a subclass)
    or a class nested in it (``self._Block(cfg)``, ``cls._Block(cfg)``)."""
    cls = index.constructed_class(func, call)
    owner = func.owner
    if cls is not None or owner is None or func.language is not Language.PYTHON:
        return cls
    callee = "".join(call.callee.split())
    if callee in ("cls", "type(self)", "self.__class__"):
        return owner
    head, _, leaf = callee.partition(".")
    if head in ("self", "cls") and IDENTIFIER.fullmatch(leaf) is not None:
        nested = f"{owner.qualname}.{leaf}"
        return next((c for c in index.classes_named(leaf) if c.qualname == nested), None)
    return None


def _receiver(func: Func, site: Site) -> tuple[str, list[Call]] | None:
    """The receiver of the move at ``site`` less its casts, and the calls
    at the move's position."""
    table = func.table
    if table is None:
        return None
    pos = table.positions
    here = [table[i] for i in func.call_ix if pos[4 * i] == site.span.line and pos[4 * i + 1] == site.span.col]
    moves = [c for c in here if c.callee.endswith((".to", ".cuda"))]
    if not moves:
        return None
    receiver = max(moves, key=lambda c: len(c.callee)).callee.rsplit(".", 1)[0]
    while (m := _CASTS.search(receiver)) is not None:
        receiver = receiver[:m.start()]
    return receiver, here


def receiver_builder(func: Func, site: Site) -> Call | None:
    """The call that built the receiver of the move at ``site``, if one can
    be told."""
    found = _receiver(func, site)
    table = func.table
    if found is None or table is None:
        return None
    receiver, here = found
    pos = table.positions
    if receiver.endswith(")"):  # built right there: `UNet(**cfg).to(...)`
        built = [c for c in here if "(" not in c.callee and not c.callee.endswith((".to", ".cuda"))]
        return min(built, key=lambda c: len(c.callee)) if built else None
    if receiver.startswith("self.") and IDENTIFIER.fullmatch(receiver[5:]) is not None and func.owner is not None:
        return _member_builder(func, receiver)
    if IDENTIFIER.fullmatch(receiver) is None:
        return None
    above = [c for c in (table[i] for i in func.call_ix if table.targets[i] == receiver and pos[4 * i] < site.span.line)
             if "(" not in c.callee and not c.callee.startswith(receiver + ".")]
    return max(above, key=lambda c: (c.span.line, c.span.col)) if above else None


_NN_LAYER = re.compile(r"(?:torch\.)?nn\.([A-Z]\w*)")
# library bases named like a model that are no torch module (pydantic)
_NOT_MODEL_BASES = frozenset({"BaseModel", "RootModel"})
_NOT_LAYERS = frozenset({"Parameter", "ParameterList", "ParameterDict", "UninitializedParameter",
                         "UninitializedBuffer", "Buffer"})


def _member_builder(func: Func, member: str, skip: str = "") -> Call | None:
    """The one construction that sets ``self.x`` anywhere in the class
    (``self.mlp = MoELayer(...)`` in ``setup_method``, moved in a test
    method); None when the member is set from different callees or from
    nothing."""
    assert func.owner is not None
    found: list[Call] = []
    for methods in func.owner.methods.values():
        for method in methods:
            table = method.table
            if table is None:
                continue
            found += [c for c in (table[i] for i in method.call_ix if table.targets[i] == member)
                      if "(" not in c.callee and not c.callee.startswith(member + ".")
                      and not (skip and last_name(c.callee) == skip)]
    return found[0] if found and len({c.callee for c in found}) == 1 else None


_MODULE_BASE = re.compile(r"(?:[\w.]+\.)?Module")
# a class no project file defines whose name says it is a layer or a model
# (`GATConv(...)`, `MegatronModule`); plural and data names are not
_MODULE_SUFFIX = re.compile(r"[A-Z]\w*(?:Model|Module|Net|Conv\dd?|Conv|Linear|Layer|Block|Encoder|Decoder"
                            r"|Transformer|Attention|Embedding|MLP)")
# a function that says it makes a model or a layer (`get_mcore_gpt_model(...)`,
# `timm.create_model(...)`, `build_norm_layer(...)`) or a model class handed in
# (`model_cls()`)
_MODEL_MAKER = re.compile(r"(?:get|create|build|load|make|init|instantiate)_\w*(?:model|layer|module|block)"
                          r"|\w*model_(?:cls|class)",
                          re.IGNORECASE)


def _named_builder(index: ProjectIndex, leaf: str) -> bool:
    """The builder is no project class, and its name says it makes a
    module: a CamelCase class of a library named like a layer or a model,
    or a function named like a model maker."""
    if _MODEL_MAKER.fullmatch(leaf) is not None:
        return True
    return _MODULE_SUFFIX.fullmatch(leaf) is not None and not index.classes_named(leaf)


# what a wrapped module is called: `model`, `vae.encoder`, `self.unet`, `text_model`
_MODULE_ARG = re.compile(r"(?:[A-Za-z_][\w.]*\.)?(?:\w+_)?(?:model|module|encoder|decoder|unet|transformer|vae"
                         r"|backbone|layer|block)")


def _wraps_module(index: ProjectIndex, leaf: str, call: Call) -> bool:
    """The builder is a library class (no project file defines it) built
    around a module it is handed first (``Adapter(vae.encoder, ...)``,
    ``Wrapper(model)``): a wrapper of a module is a module."""
    if not leaf[:1].isupper() or index.classes_named(leaf):
        return False
    args = split_args(call.arglist)
    return bool(args) and args[0].keyword is None and _MODULE_ARG.fullmatch(args[0].text.strip()) is not None


def external_module_base(index: ProjectIndex, bases: Sequence[str]) -> bool:
    """A base, followed through project classes, is a library torch module
    (``nn.Linear``, ``*Module``, a class named like a model or a layer)."""
    return _external_base(index, bases, {})


def external_module_base_of_tensors(index: ProjectIndex, bases: Sequence[str]) -> bool:
    """A base, followed through project classes, is ``torch.Tensor`` or ``nn.Parameter``."""
    return _external_base(index, bases, {}, parameters=True) or any(
        last_name(b) == "Tensor" and not index.classes_named("Tensor") for b in bases)


def _external_base(index: ProjectIndex, bases: Sequence[str], memo: dict[str, bool], depth: int = 0,
                   parameters: bool = False) -> bool:
    """A base, followed through project classes, is a library class no
    project file defines named ``*Module`` (``MegatronModule``,
    ``LightningModule``) or a ``torch.nn`` layer (``nn.Linear``); with
    ``parameters``, ``nn.Parameter`` instead."""
    for base in bases:
        leaf = last_name(base)
        found = memo.get(leaf)
        if found is None:
            memo[leaf] = False  # cycle guard
            known = index.classes_named(leaf)
            found = (not known and _library_base(base, parameters)) or (
                depth < 8 and any(_external_base(index, c.bases, memo, depth + 1, parameters) for c in known))
            memo[leaf] = found
        if found:
            return True
    return False


# libraries whose classes, taken as a base, are torch modules: each torchmetrics class is a `Metric`,
# an `nn.Module`
_MODULE_LIBRARIES = ("torchmetrics.",)


def _library_base(base: str, parameters: bool) -> bool:
    m = _NN_LAYER.fullmatch(base.strip())
    if parameters:
        return m is not None and m.group(1) == "Parameter"
    leaf = last_name(base)
    if base.strip().startswith(_MODULE_LIBRARIES) and leaf[:1].isupper():
        return True  # `torchmetrics.Metric`: every metric is an `nn.Module` (its states are buffers)
    return re.fullmatch(r"[A-Z]\w*Module", leaf) is not None or (
        _MODULE_SUFFIX.fullmatch(leaf) is not None and leaf not in _NOT_MODEL_BASES) or (
        m is not None and m.group(1) not in _NOT_LAYERS)


def _skipped_module(name: str, index: ProjectIndex, skipped: Skipped, memo: dict[str, bool],
                    text_memo: dict[str, bool], depth: int = 0) -> bool:
    """Every ``class name(...)`` in the skipped files that mention ``name``
    derives from ``nn.Module`` (by base names, through the index or other
    skipped files)."""
    found = text_memo.get(name)
    if found is not None:
        return found
    text_memo[name] = False  # cycle guard
    pattern = re.compile(rb"^[ \t]*class[ \t]+" + re.escape(name.encode()) + rb"[ \t]*\(([^)]*)\)[ \t]*:", re.M)
    definitions = [m.group(1).decode("utf-8", "replace") for data in skipped(name) for m in pattern.finditer(data)]
    known = index.classes_named(name)  # the name resolved to nothing (a re-export a skipped `__init__` makes)
    result = bool(definitions or known) \
        and all(_bases_module(b, index, skipped, memo, text_memo, depth) for b in definitions) \
        and all(is_module(index, c.qualname, c.bases, memo) for c in known)
    text_memo[name] = result
    return result


def _bases_module(text: str, index: ProjectIndex, skipped: Skipped, memo: dict[str, bool],
                  text_memo: dict[str, bool], depth: int) -> bool:
    return _bases_reach([b.strip() for b in text.split(",")], index, skipped, memo, text_memo, depth)


def _bases_reach(bases: Sequence[str], index: ProjectIndex, skipped: Skipped, memo: dict[str, bool],
                 text_memo: dict[str, bool], depth: int) -> bool:
    """Some base reaches ``Module``: by name, through a class the index
    knows (its own bases walked the same way, so a project class whose base
    chain leaves the index for a file the pre-filter skipped still counts:
    ``class Layer(EncoderLayer)``, ``EncoderLayer(LayerBase)`` with
    ``class LayerBase(nn.Module)`` in a skipped file), or through the
    skipped files' ``class`` lines."""
    for base in bases:
        if "=" in base or not base:
            continue  # `metaclass=...`
        if _MODULE_BASE.fullmatch(base):
            return True
        leaf = last_name(base)
        known = index.classes_named(leaf)
        if known and any(is_module(index, c.qualname, c.bases, memo) for c in known):
            return True
        if depth >= 4:
            continue
        if not known and _skipped_module(leaf, index, skipped, memo, text_memo, depth + 1):
            return True
        if known and _known_reach(leaf, known, index, skipped, memo, text_memo, depth + 1):
            return True
    return False


def _known_reach(leaf: str, known: Sequence[ClassInfo], index: ProjectIndex, skipped: Skipped,
                 memo: dict[str, bool], text_memo: dict[str, bool], depth: int) -> bool:
    key = "(known)" + leaf  # one walk per class name (and a cycle guard)
    found = text_memo.get(key)
    if found is None:
        text_memo[key] = False
        found = text_memo[key] = any(_bases_reach(c.bases, index, skipped, memo, text_memo, depth) for c in known)
    return found
