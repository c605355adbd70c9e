"""Stage 3, extract (Python): whether the tensor a ``*_like`` (or the
receiver of ``x.new_zeros(...)``, round 24) copies its device from is
provably a host tensor within the function, or one made on the default
device.

The source is a local (or an entry of a local, ``enc["input_ids"]``,
``enc.input_ids``: round 28, neither stored into nor moved in place by
`enc.to(device)` above the copy) that
every assignment in the enclosing function binds to a host producer:
``torch.from_numpy(...)``, ``torch.tensor(...)`` / ``torch.as_tensor(...)``
without a device, a call with ``return_tensors="pt"`` (a tokenizer's
output), or anything ending in ``.cpu()`` / ``.numpy()``; or an entry of a
local bound so, or a view of one without a call (``inp =
enc.input_ids[:, i:j]``, round 24; no attribute of it stored in the
function). A parameter (a lambda's too), an attribute, a value moved on
(``.to(...)``/``.cuda()``) or a name bound any other way stays
``device: unknown``.

``default_source``: the source is made on the *default* device: a tensor
factory without a device (`torch.arange(n)`), a torch op, a method or an
arithmetic expression of one (`torch.outer(torch.arange(n), f).float()`),
or a local every binding of which is such an expression. PyTorch puts every
tensor input of an op on one device (a 0-dim tensor aside, so only factories
that make at least one dimension count inside an op), so the result is
where the factory's is: the ``*_like`` is a factory without a device too,
a device site only under a default-device context
(``pipeline/default_device.py``). So is one of such an expression written
in place (``torch.ones(()).new_empty(shape)``, ``default_expression``). Pure.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Any

from ..names import has_word
from .common import Source, enclosing
from .python_bindings import _binding_pattern, _bindings, _bound_else, _last_binding, _statement_bindings, _value
from .python_host_defaults import (
    CPU_LITERAL,
    LEGACY_TENSORS,
    SAME_TENSOR,
    Env,
    LoopTarget,
    dtype_only,
    element_default,
    empty_shape,
    env_of,
    local_function_default,
    loop_targets,
    moved_to_host,
    mutated,
    nn_module_default,
    not_a_tensor,
)

if TYPE_CHECKING:
    from .python import PythonExtractor

_SOURCE = re.compile(r"([A-Za-z_]\w*)(?:\[\s*(?:\"[^\"]*\"|'[^']*')\s*\]|\.[A-Za-z_]\w*)?")
_FACTORY = re.compile(r"torch\.(?:from_numpy|tensor|as_tensor)\s*\(")
_PT = re.compile(r"""return_tensors\s*=\s*["']pt["']""")
_NEEDLES = (b"from_numpy", b"torch.tensor", b"as_tensor", b"return_tensors", b".cpu()", b".numpy()", b"'cpu'",
            b'"cpu"')
_MOVES = re.compile(r"\.(?:to|cuda)\s*\(|device\s*=")


def host_source(ext: PythonExtractor, node: Any, text: str) -> bool:
    """``text`` (the ``*_like`` argument) is a host tensor in ``node``'s function."""
    m = _SOURCE.fullmatch(text.strip())
    if m is None:
        return False
    name = m.group(1)
    body = enclosing(node.parent, "function_definition")
    if body is None:
        return False
    if not any(n in ext.src.data[body.start_byte:node.start_byte] for n in _NEEDLES):
        return False  # no host producer in the function at all (most functions)
    params = body.child_by_field_name("parameters")
    if params is not None and has_word(ext.src.text(params, 2000), name):
        return False
    source = ext.src.data[body.start_byte:node.start_byte].decode("utf-8", "replace")
    if name not in source:
        return False  # never bound above: no per-name pattern to compile
    if m.group(0) != name and re.search(rf"(?<![\w.]){re.escape(name)}(?:\.(?:to|cuda)\s*\(|(?:\.\w+|\[[^\]\n]*\])"
                                        r"[ \t]*=(?!=))", source):
        return False  # `enc.to(device)` moves a tokenizer's output's entries in place; an entry stored into
    if _host_bound(source, name, _DEPTH):
        return True
    # the last binding above moves it to the host (`t = t.to("cpu")`) and still holds
    return m.group(0) == name and b"cpu" in ext.src.data[body.start_byte:node.start_byte] and \
        _placed(source, ext.src.data[node.start_byte:body.end_byte].decode("utf-8", "replace"), name, "cpu",
                _DEPTH, source)


def _host_bound(source: str, name: str, depth: int) -> bool:
    """Every binding of local ``name`` in ``source`` (a function up to the
    allocation) is a host producer, or a view of a local bound only so
    (`inp = enc.input_ids[:, i:j]`); an attribute stored into it
    (`enc.input_ids = ...`) or an unpacking binds it another way."""
    values = [_value(source, hit.end()) for hit in
              re.finditer(rf"^[ \t]*{re.escape(name)}[ \t]*(?:\[[^\]\n]*\])?[ \t]*=(?!=)[ \t]*", source, re.M)]
    if not values or re.search(rf"^[ \t]*[^\n=#]*,[ \t]*{re.escape(name)}\b[^\n=]*=(?!=)", source, re.M):
        return False
    for value in values:
        if _host(value):
            continue
        view = _HOST_VIEW.fullmatch(value.strip())
        if view is None or depth <= 0 or view.group(1) == name \
                or re.search(rf"^[ \t]*{re.escape(view.group(1))}\.[\w.]+[ \t]*=(?!=)", source, re.M) \
                or not _host_bound(source, view.group(1), depth - 1):
            return False
    return True


# a subscript or attribute of a local, no call: `enc.input_ids[:, i:j]`, `batch["ids"]`
_HOST_VIEW = re.compile(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*|\[[^\[\]\n()]*\])+")


def _host(value: str) -> bool:
    value = value.strip()
    if value.endswith((".cpu()", ".numpy()")):
        return True
    if _MOVES.search(value):
        return False
    if _FACTORY.match(value) is not None:
        return True
    # a tokenizer's output given `return_tensors="pt"`, or (round 28) an entry of it: `tok(t, ...).input_ids[0]`
    value = _CALL_VIEW.sub(r"\1", value)
    return _PT.search(value) is not None and value.endswith(")")


_CALL_VIEW = re.compile(r"\A(.*\))(?:\.[A-Za-z_]\w*|\[[^\[\]\n()]*\])+\Z", re.S)


# factories that take the default device when no device is given, and those
# of them whose result always has a dimension (never a 0-dim scalar)
DEFAULT_FACTORIES = frozenset({"arange", "linspace", "logspace", "randperm", "eye", "zeros", "ones", "empty",
                                "full", "rand", "randn", "randint"})
_SHAPED = frozenset({"arange", "linspace", "logspace", "randperm", "eye"})
_SHAPED_BY_FIRST = frozenset({"zeros", "ones", "empty", "rand", "randn"})
# methods that move a tensor or read it out: the result is not where the tensor was
_MOVING = frozenset({"to", "cuda", "cpu", "pin_memory", "type", "numpy", "tolist", "item", "share_memory_"})
_DEPTH = 4  # locals followed through their bindings (a module's proof has its own budget)


def default_source(ext: PythonExtractor, node: Any, text: str) -> bool:
    """``text`` (the ``*_like`` argument, or the tensor whose ``.device`` a
    call names) is made on the default device in ``node``'s function."""
    name = text.strip()
    if not name.isidentifier():
        return False
    body = enclosing(node.parent, "function_definition")
    if body is None or b"torch." not in ext.src.data[body.start_byte:node.start_byte]:
        return False
    # every binding in the function, also those below the call (a loop may run them first): a question of the
    # function and the name alone, asked again by each `*_like` / `device=x.device` of that name there
    key = (body.start_byte, name)
    found = ext.default_sources.get(key)
    if found is None:
        source = ext.src.data[body.start_byte:body.end_byte].decode("utf-8", "replace")
        found = ext.default_sources[key] = _bound_default(ext, source, name, env_of(ext, body), _DEPTH, False,
                                                          frozenset())
    return found


def default_expression(ext: PythonExtractor, node: Any, text: str) -> bool:
    """``text`` (the copied tensor, no plain name) is an expression made on
    the default device: `torch.ones(()).new_empty(shape)`, `torch.ones_like(torch.arange(n))`,
    `torch.ones_like(model.weight)` of a module of `torch.nn` built without a device, `torch.rand_like(x[:, -1])`
    (round 26)."""
    text = text.strip()
    if not any(c in text for c in "(.[") or len(text) > 400:
        return False
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if "(" not in text and not isinstance(tree, (ast.Attribute, ast.Subscript)):
        return False
    body = enclosing(node.parent, "function_definition")
    if body is None:
        return _default_expr(ext, tree, "", Env(frozenset()), _DEPTH, False, frozenset())
    source = ext.src.data[body.start_byte:body.end_byte].decode("utf-8", "replace")
    return _default_expr(ext, tree, source, env_of(ext, body), _DEPTH, False, frozenset())


def _bound_default(ext: PythonExtractor, source: str, name: str, env: Env, depth: int,
                   shaped: bool, proving: frozenset[str]) -> bool:
    """Every binding of local ``name`` in ``source`` is a default-device
    expression (a binding that reads the name itself, `x = x.float()`,
    holds by induction: its first binding cannot read it)."""
    key = f"{name}:{shaped}"  # proven with or without a dimension: a 0-dim binding proves only the latter
    if key in proving:
        return True
    if depth <= 0 or name in env.params:
        return False
    proving = proving | {key}
    values = _statement_bindings(source, name)
    loops: list[LoopTarget] = []
    if not values and name in source and _bound_else(source, name):
        # a loop variable (round 26): `for p in model.parameters()`, `for a, b in zip(xs, ys)`
        found = loop_targets(source, name)
        if not found:
            return False
        loops = found
        values = _statement_bindings(source, name, True)
    if not loops and all(re.search(rf"(?<![\w.]){re.escape(name)}\b", v) for v in values):  # (true for none)
        return not values and name in env.given  # a parameter given a default tensor; all read it: 1st one unseen
    listed = False
    for value in values:
        try:
            tree = ast.parse(value.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        listed = listed or isinstance(tree, _LISTS)
        if not _default_expr(ext, tree, source, env, depth, shaped, proving):
            return False
    if listed and mutated(source, name):
        return False  # a list of default tensors another statement adds to or replaces an entry of
    return all(element_default(ext, loop.iterable, loop.index, loop.count, source, env, shaped,
                               lambda e, s: _default_expr(ext, e, source, env, depth, s, proving),
                               lambda n: _bound_default(ext, source, n, env, depth - 1, False, proving), _bindings)
               for loop in loops)


_LISTS = (ast.List, ast.Tuple, ast.ListComp, ast.GeneratorExp)




def _default_expr(ext: PythonExtractor, node: ast.AST, source: str, env: Env, depth: int,
                  shaped: bool, proving: frozenset[str]) -> bool:
    """An expression made on the default device (``shaped``: and never 0-dim)."""
    if isinstance(node, ast.Name):
        return _bound_default(ext, source, node.id, env, depth - 1, shaped, proving)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" and env.ctor:
        return _bound_default(ext, source, f"self.{node.attr}", env, depth - 1, shaped, proving)
    if isinstance(node, ast.Attribute):
        if node.attr in SAME_TENSOR:  # `p.data`, `p.grad`, `w.T`: where the tensor is
            return _default_expr(ext, node.value, source, env, depth, shaped, proving)
        # `nn.Linear(4, 4).weight`, `model[0].bias`: a tensor of a module built without a device
        return (not shaped or node.attr in ("weight", "bias")) and nn_module_default(
            ext, node.value, source, env, _DEPTH, _bindings)
    if isinstance(node, (ast.List, ast.Tuple)):  # a display of default-device tensors
        return bool(node.elts) and all(_default_expr(ext, e, source, env, depth, shaped, proving) for e in node.elts)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return _default_expr(ext, node.elt, source, env, depth, shaped, proving)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return local_function_default(
            ext, node, env, lambda a: _default_expr(ext, a, source, env, depth - 1, True, proving),
            lambda text, n, sub, d: _bound_default(ext, text, n, sub, d, shaped, frozenset()))
    if isinstance(node, ast.Subscript):  # a slice keeps the dimension, an index may drop it
        return (not shaped or isinstance(node.slice, ast.Slice)) and _default_expr(
            ext, node.value, source, env, depth, shaped, proving)
    if isinstance(node, ast.UnaryOp):
        return _default_expr(ext, node.operand, source, env, depth, shaped, proving)
    if isinstance(node, ast.BinOp):
        return any(_default_expr(ext, side, source, env, depth, True, proving) for side in (node.left, node.right))
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    if any(k.arg in (None, "device", "out") for k in node.keywords):
        return False  # a device given, `**kwargs` that may hold one, or an output buffer
    func = node.func
    head = ext.resolve_text(ast.unparse(func.value)) if isinstance(func.value, ast.Name) else ""
    if head == "torch":
        if func.attr in DEFAULT_FACTORIES:
            return not shaped or func.attr in _SHAPED or (
                func.attr in _SHAPED_BY_FIRST and bool(node.args) and not empty_shape(node.args[0]))
        if func.attr == "tensor" and node.args:
            return not_a_tensor(node.args[0], source, env, _bindings)
        if func.attr in LEGACY_TENSORS:  # `torch.FloatTensor((n, m))`: data or sizes, not a tensor
            return bool(node.args) and all(isinstance(a, ast.Constant) and isinstance(a.value, int)
                                           or not_a_tensor(a, source, env, _bindings) for a in node.args)
        args = [e for a in node.args for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else (a,))]
        return any(_default_expr(ext, a, source, env, depth, True, proving) for a in args)
    if moved_to_host(node):  # `x.cpu()`, `x.to("cpu")` (round 28): on the host wherever `x` was, so never on a device
        return not shaped or _default_expr(ext, func.value, source, env, depth, True, proving)
    if func.attr in _MOVING and not (func.attr == "to" and dtype_only(node)):
        return False
    return _default_expr(ext, func.value, source, env, depth, shaped, proving)


# the current GPU, said literally: `.cuda()`, `.to("cuda")`, `device="cuda"`
_ON_GPU = re.compile(r"""(?:\.cuda\(\s*(?:non_blocking\s*=\s*\w+\s*)?\)|\.to\(\s*(?:device\s*=\s*)?["']cuda["']\s*"""
                     r"""(?:,\s*non_blocking\s*=\s*\w+\s*)?\))\s*$""")
_ON_CPU = re.compile(r"""(?:\.cpu\(\s*\)|\.to\(\s*(?:device\s*=\s*)?(?:torch\.device\(\s*)?["']cpu["']\s*\)?"""
                     r"""\s*\))\s*$""")
_FACTORY_ON_GPU = re.compile(r"""^torch\.\w+\((?:[^()]|\([^()]*\))*\bdevice\s*=\s*["']cuda["']"""
                             r"""(?:[^()]|\([^()]*\))*\)$""", re.S)


def on_current_gpu(ext: PythonExtractor, node: Any, name: str, device: str = "cuda") -> bool:
    """Local ``name`` holds a tensor already on ``device`` (``"cuda"``: the
    current GPU; else a device variable's name): its last binding above the
    move (nothing between them leaves its block, or enters a loop when the
    function binds the name again anywhere below, or binds it another way)
    ends in `.cuda()` / `.to("cuda")` or is a torch factory with
    `device="cuda"` -- for a variable or an attribute chain naming one
    (`logits.device`), ends in `.to(device)` with neither the device nor the
    chain's root bound again in between -- or is a view of such a local (a
    subscript, `.view(...)`, `.reshape(...)`, ...), and the function never
    switches the current GPU. Moving it (or a view of it, `name[:, :-1]`)
    there again copies nothing. A torch factory on the same line given that
    device (`torch.randn(n, device=dev).to(dev)`) is there too, and so is the name's
    own element of a tuple written out (`a, b = a.cuda(), b.cuda()`, round 28)."""
    if name.startswith("torch.") and name.endswith(")"):
        return _made_on(name, device)
    if not name.isidentifier():
        name = _view_of(name) or ""
        if not name:
            return False
    body = enclosing(node.parent, "function_definition")
    if body is None:
        return False
    params = body.child_by_field_name("parameters")
    if params is not None and has_word(ext.src.text(params, 2000), name):
        return False
    source = ext.src.data[body.start_byte:body.end_byte].decode("utf-8", "replace")
    if _SWITCHES.search(source):
        return False  # the current device may change between the two moves (`with torch.device(...)` does not)
    before = ext.src.data[body.start_byte:node.start_byte].decode("utf-8", "replace")
    return _placed(before, source[len(before):], name, device, _DEPTH, before)


_SWITCHES = re.compile(r"set_device\(|cuda\.device\(|\bwith\b[^\n]*(?<![\w.])device\(")
# methods whose result is a view of (or on the device of) the tensor
VIEWS = frozenset({"view", "reshape", "view_as", "reshape_as", "flatten", "squeeze", "unsqueeze", "transpose",
                    "permute", "narrow", "select", "expand", "expand_as", "t", "contiguous", "detach", "clone"})


_CPU_DEVICE = "<the CPU device>"  # `_placed`'s question for a device variable


def cpu_device_local(src: Source, node: Any, name: str) -> bool:
    """Local ``name`` (a device given as `device=name` or `.to(name)`) is the
    CPU where ``node`` runs: its last binding above, in a block not left
    since (`device = torch.device("cpu")` right before the factory), is a
    CPU literal, though the function binds it otherwise elsewhere (round 26)."""
    if not name.isidentifier():
        return False
    body = enclosing(node.parent, "function_definition")
    if body is None or b"cpu" not in src.data[body.start_byte:node.start_byte]:
        return False
    params = body.child_by_field_name("parameters")
    if params is not None and has_word(src.text(params, 2000), name):
        return False
    before = src.data[body.start_byte:node.start_byte].decode("utf-8", "replace")
    after = src.data[node.start_byte:body.end_byte].decode("utf-8", "replace")
    return _placed(before, after, name, _CPU_DEVICE, _DEPTH, before)


def _placed(before: str, after: str, name: str, device: str, depth: int, upto: str) -> bool:
    """The last binding of ``name`` in ``before`` puts it on ``device`` and
    still holds at the end of ``before`` (``after``: the rest of the function;
    ``upto``: the function up to the move, of which ``before`` is a prefix)."""
    found = _last_binding(before, name)  # `x = x.to(d)`, the move's own statement, binds it after: not it
    if depth <= 0 or found is None:
        return False
    last, value, between = found
    indent = len(last.group(1))
    lines = between.split("\n")[1:]  # the lines after the binding's own, up to the move
    if any(line.strip() and len(line) - len(line.lstrip()) < indent for line in lines):
        return False  # the block was left in between: the binding may not run before the move
    if _bound_else(between, name):
        return False
    if any(re.match(r"\s*(?:async\s+)?(?:for|while)\b", line) for line in lines) and (
            re.search(rf"^[ \t]*{re.escape(name)}[ \t]*(?::[^=\n]*)?=(?!=)", after, re.M) or _bound_else(after, name)):
        return False  # a loop entered in between, and the name bound again below: a second pass may see that
    value = value.strip()
    if device == "cuda":
        if _ON_GPU.search(value) or _FACTORY_ON_GPU.match(value):
            return True
        if value == "[]":  # a list every element added to which is on the GPU: `b = inputs[1]`
            return _elements_on_gpu(between, name)
    elif device == "cpu":
        return _ON_CPU.search(value) is not None  # a view of a host tensor is not followed
    elif device == _CPU_DEVICE:
        return CPU_LITERAL.fullmatch(value) is not None
    elif re.search(rf"\.to\(\s*(?:device\s*=\s*)?{re.escape(device)}\s*(?:,\s*non_blocking\s*=\s*\w+\s*)?\)$", value):
        tail = upto[last.end():]  # up to the move: the same device variable, not bound again
        # (an attribute chain, `logits.device`: nor its root, `logits = ...`)
        names = {device, device.split(".", 1)[0]}
        if device.endswith(".device") and moved_in_place(device.removesuffix(".device"), tail):
            return False  # `model.cpu()` between: the module's device moved in place
        return not any(_binding_pattern(n).search(tail) or _bound_else(tail, n) for n in names)
    base = _view_of(value) or _like_of(value)
    if base is None or base == name:
        return False
    return _placed(before[:last.start()], before[last.start():] + after, base, device, depth - 1, upto)


# `torch.empty_like(b, dtype=...)`: made where ``b`` is (no device given)
_LIKE = re.compile(r"torch\.\w+_like\(\s*([A-Za-z_]\w*)\s*[,)]")
# arithmetic with a number or a name on the right keeps the device: `x.cuda() - 0.5`, `(x.cuda() * zeros)`
_ARITH_TAIL = re.compile(r"\s*[-+*/]\s*[\w.]+\s*$")


def _like_of(value: str) -> str | None:
    m = _LIKE.match(value)
    return m.group(1) if m is not None and "device" not in value else None


def _elements_on_gpu(between: str, name: str) -> bool:
    """Every element ``between`` adds to the list ``name`` (`name.append(v)`,
    `name[i] = v`) is on the current GPU: a move there, a factory given it,
    arithmetic on one, or arithmetic on an element of the list itself; and
    at least one is added. Any other way of adding (`extend`, `insert`, `+=`)
    proves nothing."""
    if f"{name}.extend(" in between or f"{name}.insert(" in between or f"{name} +=" in between:
        return False
    values: list[str] = []
    marker = f"{name}.append("
    at = between.find(marker)
    while at >= 0:
        if at == 0 or not (between[at - 1].isalnum() or between[at - 1] in "_."):
            arg = _value(between, at + len(marker)).rstrip()
            values.append(arg[:-1] if arg.endswith(")") else arg)
        at = between.find(marker, at + 1)
    if not values:
        return False
    for line in between.split("\n"):
        text = line.strip()
        if text.startswith(f"{name}[") and "=" in text and "==" not in text:
            value = text.split("=", 1)[1].strip()
            if not value.startswith(f"{name}[") and not _gpu_value(value):
                return False
    return all(_gpu_value(v) for v in values)


def _gpu_value(value: str) -> bool:
    value = value.strip()
    while value.startswith("(") and value.endswith(")"):
        value = value[1:-1].strip()
    while (tail := _ARITH_TAIL.search(value)) is not None and tail.start() > 0:
        value = value[:tail.start()]
    return _ON_GPU.search(value) is not None or _FACTORY_ON_GPU.match(value) is not None


def _made_on(value: str, device: str) -> bool:
    """``value`` is a `torch.<factory>(..., device=<device>)` call."""
    try:
        tree = ast.parse(value, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Attribute) \
            or not isinstance(tree.func.value, ast.Name) or tree.func.value.id != "torch" \
            or tree.func.attr not in DEFAULT_FACTORIES | {"tensor", "as_tensor"}:
        return False
    given = next((k.value for k in tree.keywords if k.arg == "device"), None)
    if given is None:
        return False
    if device == "cuda":
        return isinstance(given, ast.Constant) and given.value == "cuda"
    return isinstance(given, ast.Name) and given.id == device


def moved_in_place(root: str, source: str) -> bool:
    """A statement of ``source`` moves ``root`` and drops the result: a module moved in place."""
    moved = rf"^[ \t]*{re.escape(root)}\.(?:to|cuda|cpu|to_empty)\("
    return root in source and re.search(moved, source, re.M) is not None


def _view_of(value: str) -> str | None:
    """The local that ``value`` is a view of: `x[:, :-1]`, `x.view(n, -1)`."""
    try:
        tree = ast.parse(value, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    seen = False
    while True:
        if isinstance(tree, ast.Name):
            return tree.id if seen else None
        if isinstance(tree, ast.Subscript):
            tree = tree.value
        elif isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and tree.func.attr in VIEWS \
                and not any(k.arg in (None, "device", "out") for k in tree.keywords):
            tree = tree.func.value
        else:
            return None
        seen = True




def to_one_device(positional: list[str], kwargs: dict[str, str]) -> str | None:
    """`.to("cuda")` / `.to(device="cuda")`: ``"cuda"``, the current GPU; `.to(dev)`,
    `.to(x.device)`: the device variable's name or attribute chain; no dtype change."""
    texts = positional + [v for k, v in kwargs.items() if k == "device"]
    if len(texts) != 1 or not set(kwargs) <= {"device", "non_blocking"}:
        return None
    text = texts[0].strip()
    if re.fullmatch(r"""(['"])cuda\1""", text):
        return "cuda"
    return text if all(part.isidentifier() for part in text.split(".")) and text != "cuda" else None
