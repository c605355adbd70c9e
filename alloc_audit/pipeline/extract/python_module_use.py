"""Stage 3, extract (Python), helper of ``python_module_move``: what the code
does with a moved value that only a module allows.

A ``.to(dev)`` / ``.cuda()`` moves a module (its weights stay on it) rather
than copying a tensor when the receiver, or the name the moved value is
stored in, is used as only a module is: called (``self.norm_1(x)`` after
``self.norm_1 = norm_1.to(dev)``: a tensor is not callable), its
``.weight``/``.bias`` read, or a module's method called on it
(``next(self.layers[i].parameters())``, ``self.mlp.forward(h)``), in the same function, or, for a
member of ``self``, anywhere in its class. A subscripted receiver counts
(``self.layers[i] = self.layers[i].to(d)``). An attribute of a model stored
back onto itself, or given another part of the same model
(``model.model.embed_tokens = model.model.embed_tokens.to(d)``, rooted at a
parameter annotated with a module type, a name ``model`` / ``module``, or
the item of a loop over a model's part or its ``named_modules()``): the
attribute is a sub-module or the model's registered state, kept on the
model either way. So is a moved value kept in a name that says it is a
model or module (``self._emb_module = TableBags(...).to(d)``, ``ref_model
= build(cfg).cuda()``), or handed to a call as its ``module=`` / ``model=``
argument (``DistributedDataParallel(module=arch.to(d))``), or stored in a
local handed positionally to a function of this file whose parameter there
is annotated with a module type (``layer = layers[i].to(d)``;
``update(layer, x)`` with ``def update(layer: nn.Module, ...)``, round 26). A receiver only computed with or indexed
stays a tensor, and so does an attribute path of anything else stored back
(``state.buf = state.buf.to(d)``).

Cost: byte searches for the name in its function (in its class for
members of ``self``), one compiled pattern for what follows it, memoised
per (function, name). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .common import enclosing

if TYPE_CHECKING:
    from .python import PythonExtractor

_METHODS = (rb"eval|train|load_state_dict|state_dict|named_parameters|parameters|named_buffers|buffers"
            rb"|named_modules|modules|children|named_children|remove_weight_norm|register_buffer|register_module"
            rb"|register_forward_hook|register_forward_pre_hook|forward")
# what follows a name used as only a module is: a call, `.weight`/`.bias`, a module's method
_AFTER = re.compile(rb"\(|\.(?:weight|bias)\b|\.(?:" + _METHODS + rb")\(")
# a receiver these uses can be told for: a name or a member path, one subscript
_RECEIVER = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:\[[^\[\]\n]{1,60}\])?")
_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
# what a model (or a part of one) handed to a function is called (`model`, `ref_model`, `self._model`)
_MODEL_NAME = re.compile(r"(?:\w*_)?(?:model|module)")
# attributes of a module that are tensors or calls, not sub-modules or state
_MODULES = re.compile(r"\.(?:named_)?(?:modules|children)\(\)$")
_NOT_PARTS = frozenset({"data", "grad", "T", "mT", "H", "mH", "real", "imag"})
# a top-level def with a parameter annotated as a module (`def f(layer: nn.Module, ...)`)
_ANNOTATED_DEF = re.compile(
    rb"^def[ \t]+\w+[ \t]*\([^)]*?:[ \t]*[\"']?(?:[\w.]+\.)?(?:Module|PreTrainedModel|\w+Module)\b", re.M)
# an annotation naming a module type: `nn.Module`, `torch.nn.Module`, `"PreTrainedModel"`
_MODULE_ANNOTATION = re.compile(r"[\"']?(?:[\w.]+\.)?(?:Module|PreTrainedModel|\w+Module)[\"']?")
_CASTS = frozenset({"half", "float", "bfloat16", "double", "eval", "train", "requires_grad_", "to", "cuda"})


def used_as_module(ext: PythonExtractor, node: Any, text: str, annotated: Callable[[str], bool]) -> bool:
    """Whether the move ``node`` of receiver ``text`` (casts stripped) is a
    module's, told by use; ``annotated(name)``: a parameter of the enclosing
    function is annotated with a module type."""
    stored = _stored_in(ext, node)
    if stored is not None and (stored == text or _same_root(stored, text)) and _model_part(
            stored, lambda root: annotated(root) or _model_loop_item(ext, node, root)):
        return True  # `model.model.embed_tokens = model.model.embed_tokens.to(device)`
    if stored is not None and _MODEL_NAME.fullmatch(stored.rsplit(".", 1)[-1]) is not None:
        return True  # `self._emb_module = TableBags(...).to(device)`: kept as a module
    if _handed_as_module(ext, node):
        return True  # `DistributedDataParallel(module=arch.to(device))`
    names = [n for n in (text, stored) if n is not None and _RECEIVER.fullmatch(n) is not None]
    if any(_used(ext, node, name) for name in names):
        return True
    return stored is not None and stored.isidentifier() and _handed_to_module_parameter(ext, node, stored)


def model_name(name: str) -> bool:
    """``name`` is what a model or a module is called (``model``, ``ref_model``, ``_module``)."""
    return _MODEL_NAME.fullmatch(name) is not None


def _handed_to_module_parameter(ext: PythonExtractor, node: Any, name: str) -> bool:
    """The local ``name`` the moved value is stored in is handed, as a
    positional argument, to a function this file defines whose parameter
    there is annotated with a module type (``update(layer, x)`` with
    ``def update(layer: nn.Module, x: Tensor)``): what it takes is a module.
    One walk of the enclosing function per name, memoised."""
    owner = _scope(node, "function_definition")
    if owner is None:
        return False
    annotated = ext.module_used.get((-1, "(annotated"))
    if annotated is None:  # once per file: no top-level def annotates a parameter as a module, nothing to find
        annotated = ext.module_used[(-1, "(annotated")] = _ANNOTATED_DEF.search(ext.src.data) is not None
    if not annotated:
        return False
    key = (node.end_byte, "(" + name)
    found = ext.module_used.get(key)
    if found is None:
        found = ext.module_used[key] = any(
            _parameter_is_module(ext, callee, i) for callee, i in _positions_of(ext, owner, name, node.end_byte))
    return found


def _positions_of(ext: PythonExtractor, body: Any, name: str, after: int) -> list[tuple[str, int]]:
    """Each plain-named call in ``body`` below byte ``after`` (what the
    moved value flows into, not a use above it) with ``name`` as its
    ``i``-th positional argument: (callee, i)."""
    found: list[tuple[str, int]] = []
    if name.encode() not in ext.src.data[after:body.end_byte]:
        return found
    stack = [body]
    while stack:
        here = stack.pop()
        if here.end_byte <= after:
            continue
        if here.type == "call" and here.start_byte > after:
            fn, args = here.child_by_field_name("function"), here.child_by_field_name("arguments")
            if fn is not None and fn.type == "identifier" and args is not None and args.type == "argument_list":
                for i, arg in enumerate(args.named_children):
                    if arg.type in ("keyword_argument", "list_splat", "dictionary_splat"):
                        break
                    if arg.type == "identifier" and ext.src.text(arg, 80) == name:
                        found.append((ext.src.text(fn, 80), i))
        stack.extend(here.named_children)
    return found


def _parameter_is_module(ext: PythonExtractor, callee: str, position: int) -> bool:
    """The ``position``-th parameter of every top-level ``def callee(...)``
    of this file is annotated with a module type (``nn.Module``,
    ``torch.nn.Module``, ``"PreTrainedModel"``)."""
    pattern = re.compile(rb"^def[ \t]+" + re.escape(callee.encode()) + rb"[ \t]*\(", re.M)
    hits = list(pattern.finditer(ext.src.data))
    if not hits:
        return False
    for hit in hits:
        params = _parameters(ext.src.data[hit.end():hit.end() + 2000].decode("utf-8", "replace"))
        if position >= len(params):
            return False
        _, colon, annotation = params[position].partition(":")
        if not colon or _MODULE_ANNOTATION.fullmatch(annotation.split("=", 1)[0].strip()) is None:
            return False
    return True


def _parameters(text: str) -> list[str]:
    """The top-level comma-separated parts of a parameter list whose ``(``
    came just before ``text``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                parts.append(text[start:i])
                return [p.strip() for p in parts if p.strip()]
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return []


def _handed_as_module(ext: PythonExtractor, node: Any) -> bool:
    """The moved value is the keyword argument ``module=`` / ``model=`` (or
    ``*_module=``, ``*_model=``) of a call: what the callee takes is a module."""
    parent = node.parent
    if parent is None or parent.type != "keyword_argument":
        return False
    name = parent.child_by_field_name("name")
    value = parent.child_by_field_name("value")
    return name is not None and value is not None and value.start_byte == node.start_byte \
        and value.end_byte == node.end_byte and _MODEL_NAME.fullmatch(ext.src.text(name, 40)) is not None


def _model_part(path: str, annotated: Callable[[str], bool]) -> bool:
    """``path`` is an attribute of a model: rooted at a name (or ``self.x``)
    named like a model or annotated with a module type, its last attribute
    no tensor's."""
    if _PATH.fullmatch(path) is None:
        return False
    parts = path.split(".")
    root = parts[1] if parts[0] == "self" else parts[0]
    if len(parts) < (3 if parts[0] == "self" else 2) or parts[-1] in _NOT_PARTS or \
            any(p in ("weight", "bias") for p in parts[1:-1]):
        return False
    return _MODEL_NAME.fullmatch(root) is not None or (parts[0] != "self" and annotated(root))


def _same_root(stored: str, text: str) -> bool:
    """A part of the same object, from a getter of it, moved into the slot
    (``model.lm.embed = model.get_input_embeddings().to(d)``)."""
    root = stored.split(".", 1)[0]
    getter = text[len(root) + 1:-2] if text.startswith(root + ".get_") and text.endswith("()") else ""
    return root != "self" and getter.isidentifier()


def _model_loop_item(ext: PythonExtractor, node: Any, name: str) -> bool:
    """``name`` is the item of a ``for`` around ``node`` over a model's
    part (``for layer in model.model.layers``) or its modules
    (``for _, m in model.named_modules()``)."""
    loop = node.parent
    while loop is not None and loop.type not in ("function_definition", "module"):
        if loop.type == "for_statement":
            left, right = loop.child_by_field_name("left"), loop.child_by_field_name("right")
            item = "".join(ext.src.text(left, 80).split()).split(",")[-1] if left is not None else ""
            if right is not None and item == name:
                over = "".join(ext.src.text(right, 200).split())
                return _MODULES.search(over) is not None or (
                    _PATH.fullmatch(over) is not None and _MODEL_NAME.fullmatch(over.split(".")[0]) is not None)
        loop = loop.parent
    return False


def _used(ext: PythonExtractor, node: Any, name: str) -> bool:
    owner = _scope(node, "class_definition" if name.startswith("self.") else "function_definition")
    if owner is None:
        return False
    key = (owner.start_byte, name)
    found = ext.module_used.get(key)
    if found is None:
        found = ext.module_used[key] = _uses(ext.src.data[owner.start_byte:owner.end_byte], name.encode())
    return found


def _uses(code: bytes, name: bytes) -> bool:
    """``code`` uses ``name`` as only a module is used: calls it (not a
    ``def`` of it; for ``self.x``, not a method ``x`` the code defines),
    reads its ``.weight``/``.bias`` or calls a module's method on it. Plain
    byte searches per name, one compiled pattern for what follows."""
    method = name[5:] if name.startswith(b"self.") else b""
    defined = bool(method) and b"def " + method + b"(" in code
    at = code.find(name)
    while at >= 0:
        before = code[at - 1:at] if at else b""
        after = _AFTER.match(code, at + len(name))
        if after is not None and not (before.isalnum() or before in (b"_", b".")) and not (
                after.group() == b"(" and (defined or code[max(at - 4, 0):at] == b"def ")):
            return True
        at = code.find(name, at + 1)
    return False


def _scope(node: Any, kind: str) -> Any:
    """The innermost function (or class) around ``node``."""
    found = enclosing(node.parent, kind)
    if kind == "function_definition" or found is None:
        return found
    func = enclosing(node.parent, "function_definition")
    owner = enclosing(func.parent, "class_definition") if func is not None else None
    return found if owner is not None and owner.start_byte == found.start_byte else None


def _stored_in(ext: PythonExtractor, node: Any) -> str | None:
    """The left side of ``x = <node>`` (through casts on the moved value:
    ``layer = layer.to(d).half()``), one plain target."""
    here = node
    while (up := here.parent) is not None and up.type == "attribute" and up.parent is not None \
            and up.parent.type == "call":
        attr = up.child_by_field_name("attribute")
        if attr is None or ext.src.text(attr, 40) not in _CASTS:
            return None
        here = up.parent
    parent = here.parent
    while parent is not None and parent.type == "parenthesized_expression":
        here, parent = parent, parent.parent
    right = parent.child_by_field_name("right") if parent is not None and parent.type == "assignment" else None
    if right is None or (right.start_byte, right.end_byte) != (here.start_byte, here.end_byte):
        return None
    left = parent.child_by_field_name("left")
    if left is None or left.type not in ("identifier", "attribute", "subscript"):
        return None
    return "".join(ext.src.text(left, 200).split())
