"""Stage 3, extract (Python): whether a ``.to(device)`` / ``.cuda()`` moves a
whole ``nn.Module`` (a weight upload) rather than a tensor (a copy).

A receiver chain with a method only a module has (``.eval()``, ``.train()``,
a config's ``.build()``, ``torch.jit.load(...)``) is a module.

The receiver, through dtype and mode casts (``model.half().cuda()``), is a
module when it is, or is a local last assigned in the same function from, a
call of ``torch.nn.<Class>`` (``torch.nn.parallel.*`` included), of
``*.from_pretrained`` / ``*.from_config``, of a ``transformers``,
``diffusers`` or ``torchmetrics`` class, of a maker named for a model
(``build_model(cfg)``; the first of ``model, _ =
create_model_and_transforms(...)``), or of a class this file defines on a
base named ``*Module``, also through ``model = model.visual`` (a part of
it); or a parameter annotated with such a class (``model: nn.Module``,
``pipeline: FluxPipeline``). A move whose result is
dropped (``model.to(device)`` as a statement) is a module's too: a tensor's
``.to()`` returns a copy and changes nothing, a module's moves it in place,
unless the receiver is built by a class of this file that is no module; so
is a dropped move of an element (``qlayers[name].to(d)``) or of what a
function that is no tensor maker returns (``get_head(model).to(d)``; not
``torch.zeros(1).cuda()``, a CUDA warm-up). Round 26: an element of a
module (``seq[0].cuda()``: only a container module is indexed, and it holds
modules) is a module; ``cls(cfg)`` (``type(self)(cfg)``) in a method of a
module class builds one; a copy (``deepcopy(self.module).to(d)``) is what
it copies. Round 27: an element of a model's layer stack
(``model.model.layers[i]``, ``model.transformer.h[i]``, or a local bound
to the stack: ``layers = model.model.layers`` ... ``layers[0].to(d)``) is a
decoder layer, the ``transformers`` layout keeping its blocks in an
``nn.ModuleList``. A
class of another project file is told later, with the index
(``pipeline/module_classes.py``). Anything else (an attribute, a builder
function) stays a tensor copy: unknown is not a module. Pure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from . import python_module_use
from .common import enclosing

if TYPE_CHECKING:
    from .python import PythonExtractor

# casts and moves that return what they are called on, a module for a module
# and a tensor for a tensor (`model.half().cuda()`, `embed.to(dtype).to(device)`)
_CASTS = re.compile(r"\.(?:(?:half|float|bfloat16|double|eval|train|requires_grad_|cpu|cuda)\(\s*(?:True|False)?\s*\)"
                    r"|(?:to|cuda)\([^()]*\))$")
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_MODES = re.compile(r"\.(?:eval|train)\(\s*(?:True|False)?\s*\)")
_NONE = re.compile(r"(?:[A-Za-z_]\w*\s*=\s*)*None")
# a copy of what a name holds: `ema = deepcopy(model)`
_COPY = re.compile(r"(?:copy\.)?deepcopy\(\s*((?:self\.)?[A-Za-z_]\w*)\s*\)")
_NN_CLASS = re.compile(r"torch\.nn\.(?:modules\.\w+\.|parallel\.(?:\w+\.)?)?[A-Z]\w*$")
# `AutoModel.from_config(cfg)`, `nn.Embedding.from_pretrained(w)`
_BUILDERS = frozenset({"from_pretrained", "from_config"})
_MODULE_TYPE = re.compile(r"[\"']?(?:[\w.]+\.)?(?:Module|PreTrainedModel|\w+Module)[\"']?$")
_MEMBER = re.compile(r"(?:self\.)?[A-Za-z_]\w*")
_MEMBER_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# on the receiver chain, methods a tensor does not have: `.eval()`/`.train()`
# (a module's modes), `.build()` of a config (`Experts.Config(...).build()`),
# `torch.jit.load(...)` (a ScriptModule)
_MODULE_ONLY = re.compile(r"\.(?:eval|train)\(\s*(?:True|False)?\s*\)|\.build\(\s*\)$|^torch\.jit\.load\(")
# methods only a module has, called on a name (`model.load_state_dict(sd)`,
# `model.eval()`): the name holds a module
_MODULE_METHODS = (rb"eval|train|load_state_dict|state_dict|named_parameters|parameters|named_buffers|buffers"
                   rb"|named_modules|modules|children|remove_weight_norm|register_buffer|register_module")
_MODULE_METHOD_NAMES = re.compile(_MODULE_METHODS.decode())
_MODULE_METHOD_CALL = re.compile(rb"\.(?:" + _MODULE_METHODS + rb")\(")
_WORD_OR_DOT = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")

# a member of `self` that gets a module's method somewhere in its class
_SELF_MODULE_USE = re.compile(rb"(?<![\w.])self\.(\w+)\.(?:" + _MODULE_METHODS + rb")\(")
_NOT_MODULES = frozenset({"Parameter", "ParameterList", "ParameterDict", "UninitializedParameter"})
# libraries whose classes with a `.to`/`.cuda` are modules: models, diffusion
# pipelines (which move their modules), metrics (torchmetrics.Metric is one);
# their configs, tokenizers, schedulers and processors have no `.to`
_MODEL_LIBRARIES = ("transformers.", "diffusers.", "torchmetrics.")
# a maker function named for what it returns (`build_model(cfg)`,
# `create_model_and_transforms(...)`, whose first result is the model); not
# `build_model_inputs(...)` nor `get_model_config(...)`
_MODEL_MAKER = re.compile(r"(?:load|build|create|make|init|get)_(?:\w+_)?model(?:_and_\w+)?")
# a name used as a mapping of tensors: unpacked as keywords (`model(**batch)`)
# or read by a string key (`batch["labels"]`); no module is either
_MAPPING_USE = re.compile(rb"\*\*[ \t]*([A-Za-z_]\w*)\b(?![.\[(])|(?<![\w.])([A-Za-z_]\w*)\[[ \t]*[\"']")
# a dropped move's receiver: a name or attribute path, each part maybe subscripted (`qlayers[name]`)
_DROPPED = re.compile(r"[A-Za-z_]\w*(?:\[[^\[\]\n]{1,60}\])*(?:\.[A-Za-z_]\w*(?:\[[^\[\]\n]{1,60}\])*)*")
# an element of a name or attribute path: `layers[i]`, `model.model.layers[i]` (one subscript)
_PATH_ELEMENT = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\[[^\[\]\n]{1,60}\]")
# the attributes under which a transformer model keeps its blocks in an `nn.ModuleList` (the
# `transformers` layout: `model.layers`, `transformer.h`, `encoder.layer`, `blocks`)
_LAYER_STACKS = frozenset({"layers", "layer", "h", "blocks"})
# an element of a container: `layers[i]`, `self.blocks[name]` (one subscript)
_ELEMENT = re.compile(r"((?:self\.)?[A-Za-z_]\w*)\[[^\[\]\n]{1,60}\]")
# a construction of the class a method sits in: `cls(...)`, `type(self)(...)`, `self.__class__(...)`
_OWN_CLASS = re.compile(r"(?:cls|type\(\s*self\s*\)|self\.__class__)\s*\(")
# libraries whose calls make tensors or arrays, never a module (`torch.zeros(1).cuda()`)
_TENSOR_LIBRARIES = ("torch.", "numpy.", "np.", "cupy.", "jax.", "triton.")
# tensor methods and builtins that return tensors or plain values
_TENSOR_MAKERS = frozenset({"tensor", "zeros", "ones", "empty", "full", "rand", "randn", "arange", "clone",
                            "contiguous", "detach", "view", "reshape", "new_zeros", "new_ones", "new_empty",
                            "new_full", "new_tensor", "float", "half", "int", "long", "bool", "sum", "mean",
                            "pin_memory", "max", "min", "abs"})
# attributes of a module that are tensors, not sub-modules
_TENSOR_ATTRS = frozenset({"weight", "bias", "data", "grad", "T", "mT", "H", "mH", "real", "imag"})


def moves_module(ext: PythonExtractor, node: Any) -> bool:
    """Whether the method call ``node`` (``x.to(...)``, ``x.cuda()``) is on
    an ``nn.Module`` instance."""
    text, before = receiver_text(ext, node)
    if text is None:
        return False
    copied = _COPY.fullmatch(text)
    if copied is not None:
        text = copied.group(1)  # `deepcopy(self.module).to(d)`: a copy of a module is a module
    if _told_by_file(ext, node, text, before) or _used_as_module(ext, node, text):
        return True
    # `seq[0].to(d)`: an element of a module built as one (`nn.Sequential`, `nn.ModuleList`; not a
    # `ParameterDict`) is a module; a container only used as a module may hold parameters
    container = _ELEMENT.fullmatch(text)
    return container is not None and _told_by_file(ext, node, container.group(1), before)


def _told_by_file(ext: PythonExtractor, node: Any, text: str, before: int) -> bool:
    if _MODULE_ONLY.search(_receiver_raw(ext, node)) is not None:
        return True  # `model.eval().to(device)`, `cfg.build().cuda()`: only a module has these
    receiver = text
    if text == "self" and _self_is_module(ext, node):
        return True  # `self.to(device)` in a module's own method
    for _hop in range(8):  # `m = m.to(dtype)` follows m (or `self.m`) to the assignment above
        if _MEMBER.fullmatch(text) is None:
            break
        found = _last_assignment(ext, node, text, before)
        if found is None:
            return _annotated_module(ext, node, text) or (
                _dropped(ext, node, receiver) and not _loop_item(ext, node, text))
        if found[2]:
            return True  # `ema = deepcopy(model).eval()`: only a module has these modes
        if _passes_itself(found[0], text) or _sub_module(found[0], text):
            before = found[1]  # `model = unwrap(model)`, `model = model.visual`: what the name held above
            continue
        copied = _COPY.fullmatch(found[0])
        text, before = (copied.group(1), found[1]) if copied is not None else found[:2]
    if _layer_element(ext, node, text, before):
        return True  # `layers[0].to(d)` with `layers = model.model.layers`: a decoder layer
    if _OWN_CLASS.match(text) is not None and text.endswith(")") and _self_is_module(ext, node):
        return True  # `cls(config).to(d)` in a module class's classmethod: a new object of it
    built = _builds_module(ext, text)
    return built is True or (built is None and _dropped(ext, node, receiver))


def _layer_element(ext: PythonExtractor, node: Any, text: str, before: int) -> bool:
    """``text`` is an element of a model's layer stack (``model.model.layers[i]``,
    ``model.transformer.h[i]``, ``model.encoder.layer[i]``; or of a local
    bound to one above, ``layers = model.model.layers`` ... ``layers[0]``):
    a transformer model keeps its blocks in an ``nn.ModuleList`` under these
    attributes (the ``transformers`` layout), so the element is a module.
    The stack hangs off a model: a parameter or local named ``model`` /
    ``module`` or annotated with a module type, or a name the function uses
    as a module (``model.eval()``), one attribute deep at least; not
    ``self`` (a module's own ``self.h`` may be a tensor) nor anything else
    (``cache.layers[i]``, ``batch[0]``)."""
    m = _PATH_ELEMENT.fullmatch(text)
    if m is None:
        return False
    stack = m.group(1)
    if "." not in stack:  # a local bound to the stack above: `layers = model.model.layers`
        found = _last_assignment(ext, node, stack, before)
        if found is None or found[2] or _MEMBER_PATH.fullmatch(found[0]) is None:
            return False
        stack = found[0]
    parts = stack.split(".")
    if len(parts) < 2 or parts[-1] not in _LAYER_STACKS or parts[0] in ("self", "cls"):
        return False
    root = parts[0]
    if python_module_use.model_name(root) or _annotated_module(ext, node, root):
        return True
    body = enclosing(node.parent, "function_definition")
    if body is None:
        return False
    key = (body.start_byte, root)
    found_use = ext.module_uses.get(key)
    if found_use is None:
        found_use = ext.module_uses[key] = _module_use(ext, body, root)
    return found_use


def _used_as_module(ext: PythonExtractor, node: Any, text: str) -> bool:
    """What the code does with the receiver says it is a module: the moved
    value gets a module's method (``model.to(device).eval()``), the same
    function calls one on the receiver (``model.load_state_dict(sd)``,
    ``model.eval()``), or an attribute of ``self`` gets one in another
    method of its class (``self.router.parameters()``) or is set from a
    model loader there (``self._model = load_flow_model(...)``); or
    ``python_module_use`` tells it (the receiver or the name the move is
    stored in is called or has its ``.weight`` read; an attribute of a model
    stored back onto itself)."""
    parent = node.parent
    if parent is not None and parent.type == "attribute":
        attr = parent.child_by_field_name("attribute")
        after = parent.parent
        if attr is not None and after is not None and after.type == "call" \
                and _MODULE_METHOD_NAMES.fullmatch(ext.src.text(attr, 40)):
            return True
    if python_module_use.used_as_module(ext, node, text, lambda name: _annotated_module(ext, node, name)):
        return True
    if _MEMBER.fullmatch(text) is None:
        return False
    body = node.parent
    while body is not None and body.type not in ("function_definition", "module"):
        body = body.parent
    if body is None:
        return False
    key = (body.start_byte, text)  # many moves of one name in one function: read its bytes once
    found = ext.module_uses.get(key)
    if found is None:
        found = ext.module_uses[key] = _module_use(ext, body, text)
    return found


def _called_module_method(code: bytes, name: bytes) -> bool:
    """``re.search(rb"(?<![\\w.])" + re.escape(name) + rb"\\.(?:" + _MODULE_METHODS + rb")\\(", code)``
    (``name.eval()``, ``name.parameters()``): each spelling of ``name`` tried in place, no pattern compiled
    per name (perf-r29; tests/test_shared_patterns.py)."""
    at = code.find(name)
    while at >= 0:
        if (at == 0 or code[at - 1] not in _WORD_OR_DOT) and _MODULE_METHOD_CALL.match(code, at + len(name)):
            return True
        at = code.find(name, at + 1)
    return False


def _module_use(ext: PythonExtractor, body: Any, text: str) -> bool:
    name = re.escape(text.encode())
    code = ext.src.data[body.start_byte:body.end_byte]
    if _called_module_method(code, text.encode()):
        return True
    if not text.startswith("self."):
        return False
    owner = enclosing(body.parent, "class_definition")
    if owner is None:
        return False
    code = ext.src.data[owner.start_byte:owner.end_byte]
    if text.encode() not in code:
        return False  # every pattern below spells the name
    member = text[5:].encode()
    if any(m.group(1) == member for m in _SELF_MODULE_USE.finditer(code)):
        return True  # `self.router.parameters()` in another method of the class
    loader = rb"(?:[\w.]+\.)?\w*(?:load\w*model|model\w*load|build\w*model)\w*\("
    return re.search(rb"(?<![\w.])" + name + rb"[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*" + loader, code, re.I) is not None


def receiver_text(ext: PythonExtractor, node: Any) -> tuple[str | None, int]:
    """The receiver of ``node`` with casts stripped, and where to look above."""
    fn = node.children[0]
    receiver = fn.child_by_field_name("object") if fn.type == "attribute" else None
    if receiver is None:
        return None, 0
    text = ext.src.text(receiver, 400).strip()
    while (m := _CASTS.search(text)) is not None:
        text = text[:m.start()].strip()
    return text, node.start_byte


def _receiver_raw(ext: PythonExtractor, node: Any) -> str:
    fn = node.children[0]
    receiver = fn.child_by_field_name("object") if fn.type == "attribute" else None
    return ext.src.text(receiver, 400).strip() if receiver is not None else ""


def dispatches_to_super(ext: PythonExtractor, node: Any) -> bool:
    """``super().to(...)`` in a class's own ``to``: a method call, no move."""
    text, _before = receiver_text(ext, node)
    return text is not None and re.fullmatch(r"super\s*\([^()]*\)", text) is not None


def _dropped(ext: PythonExtractor, node: Any, text: str) -> bool:
    """The move is a statement of its own (its result dropped) on a name,
    an attribute, an element of one (``qlayers[name].to(dev)``,
    ``seq[0].cuda()``) or the result of a project function
    (``get_head(model).to(dev)``): only a module's move does something then,
    a tensor's returns a copy nobody keeps. A tensor factory's result
    (``torch.zeros(1).cuda()``, a CUDA warm-up) is no module."""
    parent = node.parent
    if parent is None or parent.type != "expression_statement" or parent.named_child_count != 1 \
            or text.endswith((".data", ".grad")):
        return False
    if _DROPPED.fullmatch(text) is not None:
        return True
    called = _CALL.match(text)
    return called is not None and _MEMBER_PATH.fullmatch(called.group(1)) is not None \
        and _balanced_call(text, called.end()) \
        and not ext.resolve_text(called.group(1)).startswith(_TENSOR_LIBRARIES) \
        and called.group(1).rsplit(".", 1)[-1] not in _TENSOR_MAKERS


def _balanced_call(text: str, start: int) -> bool:
    """``text[start:]`` closes the call opened just before ``start``, and
    nothing follows it: ``f(x)``, not ``f(x)[0]`` nor ``f(x).weight``."""
    depth = 1
    for i, ch in enumerate(text[start:], start):
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if depth == 0:
            return i == len(text) - 1
    return False


def _loop_item(ext: PythonExtractor, node: Any, name: str) -> bool:
    """``name`` is the item of a ``for`` loop around ``node`` that the loop
    uses as a mapping of tensors (``model(**batch)``, ``batch["labels"]``):
    a data batch handed out per pass, which no module is, so its dropped move
    proves nothing (a ``BatchEncoding``'s ``.to`` moves it in place too).
    A loop over modules (``for layer in layers: layer.cuda()``) keeps them."""
    loop = node.parent
    while loop is not None and loop.type not in ("function_definition", "module"):
        if loop.type == "for_statement":
            left = loop.child_by_field_name("left")
            if left is not None and name in _target_names(ext, left):
                code = ext.src.data[loop.start_byte:loop.end_byte]
                return any(name.encode() in m.groups() for m in _MAPPING_USE.finditer(code))
        loop = loop.parent
    return False


def _target_names(ext: PythonExtractor, target: Any) -> tuple[str, ...]:
    """The plain names a ``for`` target binds (``batch``; ``step, batch``)."""
    if target.type == "identifier":
        return (ext.src.text(target, 80),)
    return tuple(n for c in target.named_children for n in _target_names(ext, c))


def _passes_itself(value: str, name: str) -> bool:
    """``value`` is a call of a function (not a method of ``name``) whose
    first argument is ``name`` itself (``accelerator.unwrap_model(model)``,
    ``quantize(model, cfg)``): a wrapper or transform that hands back what it
    is given, so the name holds what it held above. A class
    (``nn.ModuleDict(parts)``) builds something new."""
    m = _CALL.match(value)
    return (m is not None and not m.group(1).startswith(name + ".") and m.group(1).rsplit(".", 1)[-1][:1].islower()
            and re.match(re.escape(m.group(0)) + r"\s*" + re.escape(name) + r"\s*[,)]", value) is not None)


def _sub_module(value: str, name: str) -> bool:
    """``name = name.attr`` (``model = model.visual``): the name now holds a
    part of what it held, a module's part when it held a module, unless the
    attribute is a tensor's (``.weight``, ``.data``)."""
    return value.startswith(name + ".") and value[len(name) + 1:].isidentifier() \
        and value[len(name) + 1:] not in _TENSOR_ATTRS


def _annotated_module(ext: PythonExtractor, node: Any, name: str) -> bool:
    """``name`` is a parameter of the enclosing function annotated with a
    module type (``model: nn.Module``, ``model: "PreTrainedModel"``)."""
    func = enclosing(node.parent, "function_definition")
    params = func.child_by_field_name("parameters") if func is not None else None
    if params is None:
        return False
    for param in params.named_children:
        if param.type not in ("typed_parameter", "typed_default_parameter"):
            continue
        names = [c for c in param.named_children if c.type == "identifier"]
        kind = param.child_by_field_name("type")
        if names and kind is not None and ext.src.text(names[0], 80) == name:
            annotation = ext.src.text(kind, 120).strip()
            return _MODULE_TYPE.match(annotation) is not None or _builds_module(ext, annotation + "()") is True
    return False


def _builds_module(ext: PythonExtractor, text: str) -> bool | None:
    """True when ``text`` builds a module, False when it provably builds
    something else (a class of this file on no ``*Module`` base), None when
    the file cannot tell."""
    m = _CALL.match(text)
    if m is None or not text.rstrip().endswith(")"):
        return None
    callee = ext.resolve_text(m.group(1))
    leaf = callee.rsplit(".", 1)[-1]
    if leaf in _BUILDERS or callee in ("torch.jit.load", "torch.jit.script"):
        return True
    if _NN_CLASS.match(callee):
        return leaf not in _NOT_MODULES
    if callee.startswith(_MODEL_LIBRARIES) and leaf[:1].isupper():
        return True  # a model library's class with .to/.cuda: a module (configs and tokenizers have neither)
    if _MODEL_MAKER.fullmatch(leaf) is not None:
        return True
    if "." in callee:
        return None
    found = re.search(rb"^[ \t]*class[ \t]+" + re.escape(callee.encode()) + rb"[ \t]*(?:\(([^)]*)\))?[ \t]*:",
                      ext.src.data, re.M)
    if found is None:
        return None
    return _module_bases(ext, (found.group(1) or b"").decode("utf-8", "replace"))


def _module_bases(ext: PythonExtractor, bases: str) -> bool:
    """Some base in ``bases`` (a class's parenthesised list) is a module:
    named ``*Module`` or a ``torch.nn`` class (``torch.nn.Linear``)."""
    for base in (b.strip() for b in bases.split(",")):
        if re.fullmatch(r"(?:[\w.]+\.)?\w*Module", base) is not None:
            return True
        if _MEMBER_PATH.fullmatch(base) is not None:
            callee = ext.resolve_text(base)
            if _NN_CLASS.match(callee) and callee.rsplit(".", 1)[-1] not in _NOT_MODULES:
                return True
    return False


def _self_is_module(ext: PythonExtractor, node: Any) -> bool:
    """``self`` in a method of a class whose bases make it a module."""
    owner = enclosing(node.parent, "class_definition")
    bases = owner.child_by_field_name("superclasses") if owner is not None else None
    return bases is not None and _module_bases(ext, ext.src.text(bases, 400).strip()[1:-1])


def _last_assignment(ext: PythonExtractor, node: Any, name: str, before: int) -> tuple[str, int, bool] | None:
    """The right-hand side of the last plain ``name = ...`` above ``before``
    in ``node``'s function (one line, casts stripped), where it starts, and
    whether a stripped cast is a module's mode (``.eval()``, ``.train()``),
    or None. A binding to ``None`` (``ema = ema_shape = None`` in the other
    branch) holds nothing a move could reach: the one above counts."""
    body = node.parent
    while body is not None and body.type not in ("function_definition", "module"):
        body = body.parent
    if body is None:
        return None
    text = ext.src.data[body.start_byte:before].decode("utf-8", "replace")
    text = text[:text.rfind("\n") + 1]  # whole lines only: not the statement `before` is in
    if name not in text:
        return None  # never assigned above: no per-name pattern to compile
    # `name = ...`, or `name, *rest = ...` (the first of the results)
    pattern = rf"^[ \t]*{re.escape(name)}[ \t]*(?::[^=\n]*|(,)[\w \t,*]*)?=(?!=)[ \t]*([^\n]+)$"
    hits = [hit for hit in re.finditer(pattern, text, re.M)  # not a keyword argument (`model=model,`)
            if not hit.group(2).rstrip().endswith(",") and hit.group(2).count(")") <= hit.group(2).count("(")]
    for found in reversed(hits):
        value = _balanced(found.group(2).strip(), text[found.end():])
        if _NONE.fullmatch(value):
            continue
        modes = False
        while (m := _CASTS.search(value)) is not None:
            modes = modes or _MODES.fullmatch(m.group(0)) is not None
            value = value[:m.start()].strip()
        if found.group(1) and not (_passes_itself(value, name) or _made_model(value)):
            continue  # a tuple from a call that tells nothing (`model, _ = prune(model=model)`): look above
        return value, body.start_byte + len(text[:found.start()].encode("utf-8")), modes
    return None


def _made_model(value: str) -> bool:
    """``value`` calls a maker named for a model (``create_model_and_transforms(...)``)."""
    m = _CALL.match(value)
    return m is not None and _MODEL_MAKER.fullmatch(m.group(1).rsplit(".", 1)[-1]) is not None


def _balanced(value: str, rest: str) -> str:
    """A value that opens a bracket on its line, completed from the lines
    below (``m = AutoModel.from_config(\\n cfg,\\n)``); as is otherwise."""
    depth = value.count("(") + value.count("[") - value.count(")") - value.count("]")
    if depth <= 0:
        return value
    for i, ch in enumerate(rest[:4000]):
        depth += 1 if ch in "([" else -1 if ch in ")]" else 0
        if depth == 0:
            return " ".join((value + rest[:i + 1]).split())
    return value
