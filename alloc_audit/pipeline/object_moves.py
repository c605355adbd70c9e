"""Stage 5, after the module moves: ``x.to(device)`` on an object of a
project class that defines its own ``to`` (or ``cuda``) and is no torch
module moves what that class's method moves, not a model's weights
(issue 11, round 22).

    class Batch(UserDict):
        def to(self, device):
            for k, v in self.data.items():
                self.data[k] = v.to(device)
            return self

    def get_logprobs(self, data: Batch):
        data.to("cuda")                 # Tensor.to: the batch's upload, per call

A move whose result is dropped looks like a module's to one file
(``extract/python_module_move.py``). Where the receiver is a parameter
annotated with a project class (``data: Batch[Any]``: data handed in per
call; an object the function builds itself, an EMA copy of the weights,
is set-up and left alone) and that class, or a project base of it,
defines the method itself and no base reaches ``nn.Module`` (nor a library
module, nor ``torch.Tensor``/``nn.Parameter``: weights), the site is a
tensor move (``Tensor.to``/``Tensor.cuda``), classified again, so the
calling function decides its tier (a batch uploaded per step: T4).

Round 25: so is the move of an object built right there (``Cameras().cuda()``,
``cams = Cameras(R, T); cams.to(d)``; not a member ``self.x``) of a project
module class whose ``to``/``cuda`` is a project override that never hands
on to ``nn.Module``'s and that registers no weight (no ``nn.Parameter``,
``register_buffer``, ``register_parameter`` in its or its project bases'
methods, no child module walked): a holder of plain tensors (camera
properties) moved, no module's weights. A plain class built right there
stays with the module rules (set-up code moving an object it made), and so
does a parameter annotated with such a module class (what a subclass
holds is not seen). And so is the move of what a tokenizer or processor
returned (``inp = tokenizer(texts, return_tensors="pt")`` ... ``inp.to(d)``,
the callee named so and no project class): a batch of encoded inputs, no
module. Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from ..catalog import TierPattern
from ..model import FileFacts, Language, Site
from .classify import classify_sites
from .default_device import is_module
from .index import ClassInfo, Func, ProjectIndex, last_name
from .module_classes import external_module_base, external_module_base_of_tensors, receiver_builder
from .names import IDENTIFIER

_MOVES = {"Module.to": "Tensor.to", "Module.cuda": "Tensor.cuda"}
# an annotation naming one class: `Batch`, `pkg.Batch`, `Batch[Any]`, `"Batch"`
_ANNOTATION = re.compile(r"""["']?([A-Za-z_][\w.]*)(?:\[.*\])?["']?""", re.DOTALL)
# a call that encodes inputs (`inp = tokenizer(texts, return_tensors="pt")`): a dict of tensors, no module
_ENCODER = re.compile(r"(?:\w*_)?(?:tokenizer|processor)", re.IGNORECASE)
# a weight registered, or child modules walked or added (`for m in self.children(): m.to(d)`)
_WEIGHT_CALL = re.compile(r"\w*Parameter|register_buffer|register_parameter|add_module|register_module|"
                          r"(?:named_)?(?:children|modules|parameters|buffers)|Module(?:List|Dict)|Sequential")


def object_moves(sites: Sequence[Site], index: ProjectIndex, files: Mapping[str, FileFacts],
                 patterns: Sequence[TierPattern]) -> list[Site]:
    memo: dict[str, bool] = {}
    moved: dict[int, Site] = {}
    for i, site in enumerate(sites):
        if site.api not in _MOVES or site.via is not None or site.language is not Language.PYTHON:
            continue
        found = index.site_call(site)
        if found is None:
            continue
        func, call = found
        receiver, _, method = call.callee.rpartition(".")
        classes = _receiver_classes(index, func, site, receiver)
        if classes and all(_own_move(index, cls, method, memo) for cls in classes):
            moved[i] = dataclasses.replace(site, api=_MOVES[site.api])
            continue
        built = receiver_builder(func, site) if not classes and not receiver.startswith("self.") else None
        cls = index.constructed_class(func, built) if built is not None else None
        if cls is not None and is_module(index, cls.qualname, cls.bases, memo) \
                and _weightless_override(index, cls, method):
            moved[i] = dataclasses.replace(site, api=_MOVES[site.api])
        elif built is not None and cls is None and _ENCODER.fullmatch(last_name(built.callee)):
            moved[i] = dataclasses.replace(site, api=_MOVES[site.api])  # `inp = tokenizer(...)`: a BatchEncoding
    if not moved:
        return list(sites)
    again = dict(zip(moved, classify_sites(moved.values(), files, patterns)))
    return [again.get(i, site) for i, site in enumerate(sites)]


def _receiver_classes(index: ProjectIndex, func: Func, site: Site, receiver: str) -> list[ClassInfo]:
    """The project classes the receiver is an instance of, when told."""
    if IDENTIFIER.fullmatch(receiver) is None or func.scope is None:
        return []
    scope = func.scope
    if receiver in scope.params and receiver not in ("self", "cls"):
        if any(a.line < site.span.line and receiver in a.targets for a in func.assigns) \
                or any(c.span.line < site.span.line and (c.target or "").strip() == receiver for c in func.calls):
            return []  # rebound above: what it holds now is another question
        types = scope.param_types
        position = scope.params.index(receiver)
        text = types[position].strip() if position < len(types) else ""
        named = _ANNOTATION.fullmatch(text)
        return index.classes_named(last_name(named.group(1))) if named is not None else []
    return []


def _own_move(index: ProjectIndex, cls: ClassInfo, method: str, memo: dict[str, bool]) -> bool:
    """The class (or a project base) defines ``method`` itself and is no torch module."""
    if cls.language is not Language.PYTHON or not index.method_lookup(cls, method):
        return False
    return not is_module(index, cls.qualname, cls.bases, memo) and not external_module_base(index, cls.bases) \
        and not external_module_base_of_tensors(index, cls.bases)


def _weightless_override(index: ProjectIndex, cls: ClassInfo, method: str) -> bool:
    """Round 25: a project module class whose ``to``/``cuda`` is a project
    override that never hands on to ``nn.Module``'s (no ``super().to``) and
    that registers no weight and walks no child module (no ``nn.Parameter``,
    ``register_buffer``, ``add_module``, ``children()``, ``parameters()``
    in its methods or its project bases'): the move is that method's, of
    the plain tensors it holds (``cameras.cuda()`` of a properties holder),
    no module's weights. (An override that moves ``self.named_children()``
    moves weights.)"""
    found = index.method_lookup(cls, method) if cls.language is Language.PYTHON else []
    if len(found) != 1 or found[0].owner is None:
        return False
    if any(c.callee.rsplit(".", 1)[-1] == method and c.callee.startswith(("super(", "super.", "nn.Module.",
                                                                         "torch.nn.Module."))
           for c in found[0].calls):
        return False
    for owner in [cls, *index.base_classes(cls)]:
        for funcs in owner.methods.values():
            if any(_WEIGHT_CALL.fullmatch(callee.rsplit(".", 1)[-1]) for f in funcs for callee in f.callees):
                return False
    return True
