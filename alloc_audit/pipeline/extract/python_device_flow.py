"""Stage 3, extract (Python): the device of each value a function binds,
followed in statement order through the ops that keep a device (issue 11,
round 30, ``device provenance``).

Input: a Python function (or a module's top-level statements) and a move
or factory site in it. Output: the *device token* of the moved value and of
the move's target, or of the tensor a factory copies its device from. A token
names one device without knowing which: ``host`` (``.cpu()``,
``torch.from_numpy``, a tokenizer's ``return_tensors="pt"`` output, a
``"cpu"`` literal), ``default`` (a torch factory given no device: the default
device, a device site only under a default-device context), ``cuda`` (the
current GPU, when the function never switches it), ``param:x`` (the device of
the parameter ``x``), ``lit:cuda:0``, or the device of one value the function
bound (``val@L:C``: a call of unknown device at line L, column C). A value's
token is that of the value it was made from through an op that keeps its
device: arithmetic, ``torch.cat``/``stack`` of values on one device, a view,
a slice, a dtype cast, a reduction, ``torch.where``, an op of
``torch.nn.functional`` / ``linalg`` / ``fft`` / ``special``, a tensor
method that stays, a factory given ``device=E`` (``E``'s token) or a
``*_like`` without one, ``.to(E)`` / ``.cuda()`` (the target's token). A
list built from ``[]`` by ``append``/``extend``/``insert``/``xs[i] = v`` or
written out has the token of its elements when they share one.

The walk is an abstract interpretation: branches join (a name bound to
different tokens on two paths gets a fresh token at the join, so nothing
derived before the join equals it), a loop is run to a fixpoint and every
token made inside its body is new on each pass (joined at the loop head),
``break``/``continue``/``return``/``raise`` end a path, a ``try`` body may
stop anywhere, a ``with`` of an unknown manager (``deepspeed.zero.Init()``)
may place the factories in it, and a dropped ``m.to(d)`` moves a module in
place. An op mixing a host and an unknown value is of unknown device (a
0-dim host tensor goes with a GPU one); of a host and a GPU value, on the GPU.

Rule (``noop_move``): ``x.to(E)`` / ``x.cuda()`` copies nothing when ``x``'s
token is ``E``'s, or ``E`` is the host or ``None``. True: ``inp =
inps[i].to(dev)`` then ``f(inp.to(dev))``; ``torch.stack([F.pad(torch.ones(n,
device=d), p) for ...]).to(d)``. False: ``x = y.to(d)`` in one branch of an
``if``, then ``x.to(d)``; ``x.to(other)``; ``f(x).to(d)``; ``x.to(d,
copy=True)``. ``copied_device``: a ``*_like`` / ``new_*`` / ``device=x.device``
of a value whose token is ``host`` allocates no device memory; of one whose
token is ``default``, where the default device is. True: ``m = x.cpu() * 2;
torch.zeros_like(m)``. False: ``m = x.cpu() * y`` (``y`` of unknown device).
Pure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from .common import enclosing

if TYPE_CHECKING:
    from .python import PythonExtractor

HOST = "host"
DEFAULT = "default"
NONE = "none"  # `.to(None)`: returns the tensor itself
_EMPTY = "empty"  # a list with no element yet: no device to disagree with
_SCALAR = "scalar"  # no tensor: a number, a shape, a dtype, a string
_DTYPE = "dtype"
_POS = re.compile(r"@(\d+):(\d+)")
_LOOP_PASSES = 4
_DEPTH = 40  # expression nesting followed


class Val(NamedTuple):
    """A value's device token (None: unknown), whether every tensor it holds
    is on that device (a tensor, or a list of such), and whether it is a list
    this function built (appends join its token)."""

    token: str | None
    uniform: bool = False
    listy: bool = False


_UNKNOWN = Val(None)
_SCALAR_VAL = Val(_SCALAR)

# torch factories: given a device, there; without one, on the default device
_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace",
                        "logspace", "eye", "randperm", "empty_strided", "scalar_tensor", "tensor", "Tensor",
                        "FloatTensor", "LongTensor", "IntTensor", "BoolTensor", "HalfTensor", "DoubleTensor",
                        "ByteTensor", "CharTensor", "ShortTensor", "BFloat16Tensor", "normal", "tril_indices",
                        "triu_indices", "hann_window", "hamming_window", "blackman_window", "kaiser_window"})
_WRAPPERS = frozenset({"as_tensor", "asarray"})  # of a tensor: where it is; of data: the default device
_HOST_MAKERS = frozenset({"from_numpy", "frombuffer", "from_file"})
# torch top-level names that are no tensor op (the device they return, if any, is not their inputs')
_NOT_OPS = frozenset({"load", "save", "device", "Size", "manual_seed", "no_grad", "is_tensor", "compile", "jit",
                      "get_default_dtype", "set_default_dtype", "Generator", "empty_cache", "get_default_device",
                      "set_default_device", "finfo", "iinfo", "is_floating_point", "numel", "is_grad_enabled",
                      "set_grad_enabled", "inference_mode", "enable_grad", "autocast", "broadcast_shapes",
                      "use_deterministic_algorithms", "set_printoptions", "from_dlpack", "cuda", "distributed",
                      "utils", "hub", "ops", "classes", "library", "fx", "export", "onnx", "backends", "sparse",
                      "nested", "testing", "profiler", "multiprocessing", "optim", "nn", "amp", "func", "_C",
                      "xpu", "mps", "npu", "cpu", "random", "overrides", "quantization", "ao", "package"})
_OP_NAMESPACES = ("torch.nn.functional.", "torch.linalg.", "torch.fft.", "torch.special.")
_DTYPES = frozenset({"float", "float16", "float32", "float64", "half", "double", "bfloat16", "int", "int8", "int16",
                     "int32", "int64", "uint8", "long", "short", "bool", "complex64", "complex128", "cfloat",
                     "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32",
                     "uint64", "qint8", "quint8", "qint32"})
# tensor methods whose result is on the tensor's device
_STAYS = frozenset({
    "view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose",
    "permute", "narrow", "select", "expand", "expand_as", "t", "contiguous", "detach", "clone", "float", "half",
    "bfloat16", "double", "int", "long", "bool", "short", "char", "byte", "abs", "neg", "exp", "log", "log2", "log1p",
    "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "pow", "clamp", "clamp_min", "clamp_max", "clip",
    "sum", "mean", "amax", "amin", "max", "min", "prod", "cumsum", "cumprod", "argmax", "argmin", "softmax",
    "log_softmax", "masked_fill", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
    "sign", "reciprocal", "add", "sub", "mul", "div", "matmul", "bmm", "mm", "repeat", "repeat_interleave", "roll",
    "flip", "tril", "triu", "norm", "std", "var", "index_select", "gather", "scatter", "scatter_add",
    "masked_select", "masked_scatter", "nonzero", "sort", "topk", "chunk", "split", "unbind", "tensor_split",
    "median", "mode", "kthvalue", "std_mean", "var_mean", "aminmax", "unique", "floor", "ceil", "round", "trunc",
    "any", "all", "square", "diag", "diagonal", "outer", "type_as", "masked_fill_", "add_", "mul_", "div_", "sub_",
    "copy_", "zero_", "fill_", "clamp_", "abs_", "neg_", "exp_", "sqrt_", "floor_divide", "remainder", "fmod",
    "where", "lerp", "addmm", "baddbmm", "einsum", "movedim", "swapaxes", "swapdims", "unfold", "isnan",
    "isinf", "isfinite", "nan_to_num", "logsumexp", "erf", "sinh", "cosh", "atan", "atan2", "tan", "asin", "acos",
    "requires_grad_", "retain_grad", "conj", "real", "imag", "angle", "to_dense", "coalesce", "to_sparse",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "argsort", "cummax", "cummin", "diff", "frac",
    "index_add", "index_copy", "index_fill", "index_put", "masked_scatter_", "scatter_", "scatter_add_",
    "index_add_", "index_copy_", "index_fill_", "index_put_", "new_tensor", "new_zeros", "new_ones", "new_empty",
    "new_full", "addcmul", "addcdiv", "minimum", "maximum", "dot", "matrix_power", "kron", "cross"})
# methods of a list that add its argument (joined), or its elements
_ADDS = frozenset({"append", "insert"})
# builtins whose result is no tensor, and those whose result holds their argument's tensors
_SCALAR_BUILTINS = frozenset({"len", "int", "float", "bool", "str", "range", "isinstance", "print", "hasattr",
                              "getattr", "type", "id", "hash", "repr", "round", "abs", "divmod", "ord", "chr",
                              "format", "callable", "issubclass", "setattr", "delattr", "super", "iter", "next"})
_KEEPS_BUILTINS = frozenset({"list", "tuple", "sorted", "reversed"})
# context managers that place nothing
_NO_PLACEMENT = re.compile(r"(?:torch\.)?(?:no_grad|inference_mode|enable_grad|set_grad_enabled|autocast|"
                           r"amp\.autocast|cuda\.amp\.autocast|profiler\.\w+|autograd\.\w+)\b|"
                           r"(?:\w+\.)?assert\w+|pytest\.\w+|warnings\.\w+|open\b|contextlib\.\w+|nullcontext\b|"
                           r"tqdm\b|timer\b|self\.assert\w+")
_SWITCHES = re.compile(r"set_device\(|cuda\.device\(|\bdevice_of\(|\bwith\b[^\n]*(?<![\w.])device\(")


def _positions(token: str | None) -> Iterable[tuple[int, int]]:
    if token is None:
        return ()
    return ((int(a), int(b)) for a, b in _POS.findall(token))


class _Loop:
    """A loop being walked: its span and the environments its `continue`s and `break`s leave."""

    def __init__(self, node: ast.stmt) -> None:
        self.first = node.lineno
        self.last = getattr(node, "end_lineno", None) or node.lineno
        self.continues: list[dict[str, Val]] = []
        self.breaks: list[dict[str, Val]] = []

    def inside(self, token: str | None) -> bool:
        return any(self.first <= line <= self.last for line, _ in _positions(token))


Env = dict[str, Val]


class Flow:
    """The device tokens of one function's locals before each of its statements."""

    def __init__(self, ext: PythonExtractor, fn: ast.AST, params: frozenset[str], dtypes: frozenset[str],
                 source: str) -> None:
        self.ext = ext
        self.params = params
        self.dtypes = dtypes  # parameters annotated or defaulted as a dtype
        self.switches = _SWITCHES.search(source) is not None
        self.before: dict[int, Env] = {}
        self.volatile: set[str] = set()  # `global` / `nonlocal` names: a call may bind them
        self.loops: list[_Loop] = []
        self.parents: dict[int, ast.AST] = {}
        for parent in ast.walk(fn):
            for child in ast.iter_child_nodes(parent):
                self.parents[id(child)] = parent
        self.bound = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        body = fn.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)) else []
        self.block(body, {})

    # ------------------------------------------------------------ statements
    def block(self, body: list[ast.stmt], env: Env | None) -> Env | None:
        for stmt in body:
            if env is None:
                return None  # after a return, raise, break or continue: never runs on this path
            env = self.stmt(stmt, env)
        return env

    def stmt(self, node: ast.stmt, env: Env) -> Env | None:
        self.before[id(node)] = dict(env)
        env = dict(env)
        if isinstance(node, ast.Assign):
            value = self.dev(node.value, env)
            for target in node.targets:
                self.bind(target, value, node.value, env)
            return env
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.bind(node.target, self.dev(node.value, env), node.value, env)
            return env
        if isinstance(node, ast.AugAssign):
            self.augment(node, env)
            return env
        if isinstance(node, ast.Expr):
            self.effect(node.value, env)
            return env
        if isinstance(node, (ast.Return, ast.Raise)):
            return None
        if isinstance(node, (ast.Break, ast.Continue)):
            if self.loops:
                (self.loops[-1].breaks if isinstance(node, ast.Break) else self.loops[-1].continues).append(env)
            return None
        if isinstance(node, ast.If):
            self.dev(node.test, env)
            return self.join(self.block(node.body, dict(env)), self.block(node.orelse, dict(env)), node)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            return self.loop(node, env)
        if isinstance(node, (ast.With, ast.AsyncWith)):
            return self.with_(node, env)
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            return self.try_(node, env)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.forget(node.name, env)
            env[node.name] = Val(self.fresh("def", node))
            return env
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            self.volatile.update(node.names)
            return env
        if isinstance(node, ast.Delete):
            for target in node.targets:
                for name in self.names_in(target):
                    self.forget(name, env)
            return env
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                self.forget(name, env)
                env[name] = Val(self.fresh("import", node))
            return env
        if isinstance(node, (ast.Pass, ast.Assert)):
            return env
        # anything else (`match`): every name it binds is of unknown device after it
        for name in self.stored(node):
            self.forget(name, env)
            env[name] = Val(self.fresh("stmt", node))
        return env

    def loop(self, node: ast.For | ast.AsyncFor | ast.While, env: Env) -> Env | None:
        loop = _Loop(node)
        element = self.element(node.iter, env) if isinstance(node, (ast.For, ast.AsyncFor)) else None
        head = dict(env)
        out: Env | None = None
        for _ in range(_LOOP_PASSES):
            loop.continues, loop.breaks = [], []
            self.loops.append(loop)
            try:
                inner = dict(head)
                if isinstance(node, ast.While):
                    self.dev(node.test, inner)
                else:
                    self.bind_element(node.target, element, node, inner)
                out = self.block(node.body, inner)
            finally:
                self.loops.pop()
            ends = [e for e in (out, *loop.continues) if e is not None]
            new = head
            for end in ends:
                new = self.loop_join(new, end, env, loop, node)
            if new == head:
                break
            head = new
        else:
            head = {k: (v if env.get(k) == v else Val(self.fresh(f"phi:{k}", node))) for k, v in head.items()}
        if isinstance(node, ast.While):
            self.before[id(node)] = dict(head)  # the test runs at the head of every pass
        exit_env: Env | None = head
        for broken in loop.breaks:
            exit_env = self.join(exit_env, broken, node)
        return self.block(node.orelse, exit_env) if node.orelse else exit_env

    def loop_join(self, head: Env, end: Env, entry: Env, loop: _Loop, node: ast.stmt) -> Env:
        """The head of the next pass: a token made inside the body is another device's on the next pass."""
        out: Env = {}
        for key in head.keys() | end.keys():
            a, b = self.implicit(head, key), self.implicit(end, key)
            if a == b and a is not None:
                out[key] = a
            elif b is None or a is None and not key.isidentifier():
                out[key] = Val(self.fresh(f"phi:{key}", node))
            elif a is None:
                out[key] = b if not loop.inside(b.token) else Val(self.fresh(f"phi:{key}", node))
            elif loop.inside(b.token) or loop.inside(a.token) and a.token != b.token:
                out[key] = Val(self.fresh(f"phi:{key}", node), a.uniform and b.uniform and not (a.listy or b.listy),
                               a.listy and b.listy)
            else:
                out[key] = self.join_val(a, b, key, node)
        return out

    def with_(self, node: ast.With | ast.AsyncWith, env: Env) -> Env | None:
        saved = env.get("<default>")
        for item in node.items:
            call = item.context_expr
            text = ast.unparse(call)
            if isinstance(call, ast.Call) and self.resolve(call.func) == "torch.device" and call.args:
                env["<default>"] = Val(self.device(call, env))  # a default-device context
            elif not _NO_PLACEMENT.match(text):
                env["<default>"] = Val(self.fresh("ctx", node))  # `deepspeed.zero.Init()` may place what is built
            else:
                self.dev(call, env)
            if item.optional_vars is not None:
                self.bind(item.optional_vars, Val(self.fresh("with", node)), None, env)
        after = self.block(node.body, env)
        if after is not None:
            if saved is None:
                after.pop("<default>", None)
            else:
                after["<default>"] = saved
        return after

    def try_(self, node: Any, env: Env) -> Env | None:
        body_out = self.block(node.body, dict(env))
        # a handler may start anywhere in the body: what the body binds is of unknown device there
        stopped = dict(env)
        for name in self.stored_in(node.body):
            self.forget(name, stopped)
            stopped[name] = Val(self.fresh(f"try:{name}", node))
        ends: list[Env | None] = [self.block(node.orelse, body_out) if node.orelse else body_out]
        for handler in node.handlers:
            start = dict(stopped)
            if handler.name:
                start[handler.name] = Val(self.fresh("exc", handler))
            ends.append(self.block(handler.body, start))
        out: Env | None = None
        for end in ends:
            out = self.join(out, end, node)
        if node.finalbody:
            if out is None:
                self.block(node.finalbody, dict(stopped))
                return None
            return self.block(node.finalbody, out)
        return out

    def augment(self, node: ast.AugAssign, env: Env) -> None:
        key = self.key(node.target)
        if key is None:
            return
        old = self.dev(node.target, env)
        value = self.dev(node.value, env)
        if old.listy:
            env[key] = self.add(old, value if value.uniform else Val(None))
        elif old.token in (None, _SCALAR):
            self.forget(key, env)
            env[key] = self.combine([old, value], [node.target, node.value])
        # `x += y` of a tensor: in place, `x` stays where it is

    def effect(self, call: ast.expr, env: Env) -> None:
        """A statement that only calls: a list grown, a module moved in place, the default device set."""
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            key = self.key(call.func.value)
            method = call.func.attr
            if key is not None and method in _ADDS | {"extend"} and call.args:
                old = self.dev(call.func.value, env)
                if old.listy:
                    added = self.dev(call.args[-1], env)
                    env[key] = self.add(old, added if method != "extend" else (added if added.uniform else _UNKNOWN))
                else:
                    self.forget(key, env)
                    env[key] = Val(self.fresh("grown", call))
                return
            if key is not None and method in ("to", "cuda", "cpu", "to_empty", "apply", "half", "float", "bfloat16",
                                              "double", "xpu", "npu", "mps", "share_memory_", "load_state_dict",
                                              "set_", "requires_grad_"):
                self.forget(key, env)
                env[key] = Val(self.fresh("moved", call))  # a module moved in place, whatever it held
                return
            if self.resolve(call.func) == "torch.set_default_device" and call.args:
                env["<default>"] = Val(self.device(call.args[0], env))
                return
        self.dev(call, env)

    # ------------------------------------------------------------ bindings
    def bind(self, target: ast.expr, value: Val, node: ast.expr | None, env: Env) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == len(elts) \
                    and not any(isinstance(e, ast.Starred) for e in (*elts, *node.elts)):
                values = [self.dev(e, env) for e in node.elts]  # evaluated before any target is bound
                for t, v, n in zip(elts, values, node.elts, strict=True):
                    self.bind(t, v, n, env)
                return
            for i, t in enumerate(elts):
                if isinstance(t, ast.Starred):
                    self.bind(t.value, Val(value.token if value.uniform else None, value.uniform, True), None, env)
                elif value.uniform:
                    self.bind(t, Val(value.token, True), None, env)
                elif value.token is not None and value.token not in (_SCALAR, HOST, DEFAULT) \
                        and not any(isinstance(e, ast.Starred) for e in elts):
                    self.bind(t, Val(f"{value.token}[{i}]"), None, env)
                else:
                    self.bind(t, _UNKNOWN, None, env)
            return
        if isinstance(target, ast.Starred):
            self.bind(target.value, Val(None, False, True), None, env)
            return
        if isinstance(target, ast.Subscript):
            key = self.key(target.value)
            if key is None:
                return
            old = self.dev(target.value, env)
            if old.listy:
                env[key] = self.add(old, value)
            elif not old.uniform:
                self.forget(key, env)
                env[key] = Val(self.fresh("stored", target))  # an entry of a dict or an object replaced
            return  # a tensor written in place stays where it is
        key = self.key(target)
        if key is None:
            return
        if isinstance(target, ast.Attribute) and target.attr == "data":
            base = self.key(target.value)
            if base is not None:  # `p.data = v`: the tensor `p` now holds `v`'s memory
                self.forget(base, env)
                env[base] = Val(value.token, value.uniform)
            return
        self.forget(key, env)
        env[key] = value

    def bind_element(self, target: ast.expr, element: list[Val] | Val | None, node: ast.AST, env: Env) -> None:
        """A loop target bound to an element of what it iterates (``zip`` and ``enumerate`` split)."""
        if isinstance(element, list) and isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == len(element):
            for t, v in zip(target.elts, element, strict=True):
                self.bind_element(t, v, node, env)
            return
        if isinstance(element, Val) and element.uniform and element.token is not None:
            self.bind(target, Val(element.token, True), None, env)
            return
        for name in self.names_in(target):
            self.forget(name, env)
            env[name] = Val(self.fresh(f"iter:{name}", node))  # another value on each pass

    def element(self, it: ast.expr, env: Env) -> list[Val] | Val | None:
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and not it.keywords \
                and not any(isinstance(a, ast.Starred) for a in it.args):
            if it.func.id == "zip" and it.func.id not in env:
                return [self.dev(a, env) for a in it.args]
            if it.func.id == "enumerate" and len(it.args) == 1 and it.func.id not in env:
                return [_SCALAR_VAL, self.dev(it.args[0], env)]
            if it.func.id == "range":
                return _SCALAR_VAL
        value = self.dev(it, env)
        return value if value.uniform else None

    def key(self, node: ast.expr) -> str | None:
        """The environment key of a name or an attribute chain (``self.buf``)."""
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = self.key(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        return None

    def forget(self, key: str, env: Env) -> None:
        """``key`` is bound again: what was known of its attributes no longer holds."""
        prefix = key + "."
        for k in [k for k in env if k.startswith(prefix)]:
            del env[k]
        env.pop(key, None)

    def add(self, old: Val, added: Val) -> Val:
        """A list's token once ``added`` (an element) joins it."""
        if old.token == _EMPTY:
            return Val(added.token, added.token is not None, True)
        if old.uniform and added.token == old.token:
            return old
        return Val(None, False, True)

    def join(self, a: Env | None, b: Env | None, node: ast.AST) -> Env | None:
        if a is None:
            return b
        if b is None:
            return a
        out: Env = {}
        for key in a.keys() | b.keys():
            x, y = self.implicit(a, key), self.implicit(b, key)
            if x is None or y is None:
                present = x if x is not None else y
                if key.isidentifier() and key not in self.params and present is not None:
                    out[key] = present  # bound on one path only: read, it is that path's (or unbound)
                else:
                    out[key] = Val(self.fresh(f"phi:{key}", node))
            else:
                out[key] = self.join_val(x, y, key, node)
        return out

    def implicit(self, env: Env, key: str) -> Val | None:
        """``key``'s value in ``env``, also when no statement bound it yet: a parameter's or a free name's
        own, an attribute chain's, the default device; None for a local not bound on this path."""
        if key in env:
            return env[key]
        if key == "<default>":
            return Val(DEFAULT)
        if key.isidentifier():
            return None if key in self.bound and key not in self.params else self.lookup(key, env)
        try:
            return self.dev(ast.parse(key, mode="eval").body, env)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None

    def join_val(self, x: Val, y: Val, key: str, node: ast.AST) -> Val:
        if x == y:
            return x
        if x.listy and y.listy and _EMPTY in (x.token, y.token):
            return y if x.token == _EMPTY else x
        return Val(self.fresh(f"phi:{key}", node), x.uniform and y.uniform, x.listy and y.listy)

    def fresh(self, what: str, node: ast.AST) -> str:
        return f"{what}@{getattr(node, 'lineno', 0)}:{getattr(node, 'col_offset', 0)}"

    def names_in(self, target: ast.AST) -> list[str]:
        return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]

    def stored(self, node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | {
            k for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            for k in [self.key(n)] if k is not None}

    def stored_in(self, body: list[ast.stmt]) -> set[str]:
        out: set[str] = set()
        for stmt in body:
            out |= self.stored(stmt)
            for n in ast.walk(stmt):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                    key = self.key(n.func.value)
                    if key is not None:
                        out.add(key)  # `xs.append(v)`, `model.cuda()`: changed in place
        return out

    # ------------------------------------------------------------ expressions
    def resolve(self, func: ast.expr) -> str:
        """The dotted name a chain of names spells, an import alias at its head resolved (`F.pad`:
        `torch.nn.functional.pad`); empty for anything else (`torch.cat(xs).flatten`)."""
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return ""
        return self.ext.resolve_text(".".join([func.id, *reversed(parts)]))

    def lookup(self, name: str, env: Env) -> Val:
        if name in env:
            return env[name]
        if name in self.volatile:
            return _UNKNOWN
        if name in self.dtypes:
            return Val(_DTYPE)
        if name in self.params:
            return Val(f"param:{name}")
        if name in self.bound:
            return _UNKNOWN  # a local not bound on this path yet
        return Val(f"free:{name}")

    def dev(self, node: ast.expr, env: Env, depth: int = _DEPTH) -> Val:
        if depth <= 0:
            return _UNKNOWN
        down = depth - 1
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                return Val(_string_device(node.value, self.cuda(node)) or _SCALAR)
            return Val(NONE) if node.value is None else _SCALAR_VAL
        if isinstance(node, ast.Name):
            return self.lookup(node.id, env)
        if isinstance(node, ast.Attribute):
            key = self.key(node)
            if key is not None and key in env:
                return env[key]
            resolved = self.resolve(node)
            if resolved.startswith("torch.") and resolved[6:] in _DTYPES:
                return Val(_DTYPE)
            base = self.dev(node.value, env, down)
            if node.attr == "device":
                return Val(base.token if base.token not in (_SCALAR, _DTYPE, NONE) else None)
            if node.attr == "dtype":
                return Val(_DTYPE)
            if node.attr in ("shape", "ndim", "is_cuda", "requires_grad", "is_leaf"):
                return _SCALAR_VAL
            if base.uniform or node.attr in ("data", "grad", "T", "mT", "H", "mH", "real", "imag"):
                return Val(base.token, base.uniform)
            if base.token is None or base.token in (_SCALAR, _DTYPE, NONE, HOST, DEFAULT, _EMPTY):
                return _UNKNOWN
            return Val(f"{base.token}.{node.attr}")
        if isinstance(node, ast.Subscript):
            base = self.dev(node.value, env, down)
            self.dev(node.slice, env, down)
            if base.uniform:
                return Val(base.token, True)
            if base.token is None or base.token in (_SCALAR, _DTYPE, NONE, _EMPTY):
                return _UNKNOWN
            index = node.slice
            if isinstance(index, ast.Tuple) and any(isinstance(e, ast.Slice) or _none(e) or _ellipsis(e)
                                                    for e in index.elts) or _none(index) or _ellipsis(index):
                return Val(base.token, True)  # `x[:, 1:]`, `x[None]`: a tensor's view
            if isinstance(index, ast.Constant) and base.token not in (HOST, DEFAULT):
                return Val(f"{base.token}[{index.value!r}]")
            return _UNKNOWN
        if isinstance(node, (ast.BinOp, ast.Compare)):
            sides = [node.left, node.right] if isinstance(node, ast.BinOp) else [node.left, *node.comparators]
            return self.combine([self.dev(s, env, down) for s in sides], sides)
        if isinstance(node, ast.UnaryOp):
            return self.dev(node.operand, env, down)
        if isinstance(node, ast.IfExp):
            self.dev(node.test, env, down)
            a, b = self.dev(node.body, env, down), self.dev(node.orelse, env, down)
            if a.token == NONE:
                return b
            if b.token == NONE or a == b:
                return a
            return _UNKNOWN
        if isinstance(node, (ast.List, ast.Tuple)):
            values = [self.dev(e, env, down) for e in node.elts]
            if not values:
                return Val(_EMPTY, True, True)
            if any(isinstance(e, ast.Starred) for e in node.elts):
                return Val(None, False, True)
            first = values[0].token
            same = first is not None and first not in (_SCALAR, NONE, _DTYPE) and all(v.token == first for v in values)
            return Val(first if same else None, same, True)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return self.comprehension(node, env, down)
        if isinstance(node, ast.NamedExpr):
            value = self.dev(node.value, env, down)
            self.bind(node.target, value, node.value, env)
            return value
        if isinstance(node, ast.Call):
            return self.call(node, env, down)
        if isinstance(node, ast.JoinedStr):
            return _SCALAR_VAL
        return _UNKNOWN

    def comprehension(self, node: ast.ListComp | ast.GeneratorExp | ast.SetComp, env: Env, depth: int) -> Val:
        inner = dict(env)
        for gen in node.generators:
            self.bind_element(gen.target, self.element(gen.iter, inner), node, inner)
        value = self.dev(node.elt, inner, depth)
        span = ((node.lineno, node.col_offset), (node.end_lineno or node.lineno, node.end_col_offset or 0))
        made_inside = any(span[0] <= p <= span[1] for p in _positions(value.token))  # another value per element
        if value.token is None or made_inside or value.token in (_SCALAR, NONE, _DTYPE):
            return Val(None, False, isinstance(node, ast.ListComp))
        return Val(value.token, True, isinstance(node, ast.ListComp))

    def combine(self, values: list[Val], nodes: list[ast.expr]) -> Val:
        """An op's device: that of an input on a GPU-or-unknown-but-named device; the host (or the default
        device) only when every tensor input is proven there."""
        if any(v.listy and not v.uniform for v in values):
            return _UNKNOWN  # a list of tensors of unknown devices
        tokens = [v.token for v, n in zip(values, nodes, strict=False)
                  if not isinstance(n, ast.Constant) and v.token not in (_SCALAR, _DTYPE, NONE, _EMPTY)]
        strong = [t for t in tokens if t is not None and t not in (HOST, DEFAULT)]
        if strong:
            return Val(strong[0], True)
        if tokens and all(t in (HOST, DEFAULT) for t in tokens):
            return Val(DEFAULT if DEFAULT in tokens else HOST, True)
        if not tokens and values:
            return _SCALAR_VAL
        return _UNKNOWN

    def cuda(self, node: ast.AST) -> str:
        return self.fresh("cuda", node) if self.switches else "cuda"

    def device(self, node: ast.expr, env: Env) -> str | None:
        """The token of a device argument (`device=E`, `.to(E)`): a literal, a device variable, `x.device`,
        or a tensor (`.to(other)`)."""
        if isinstance(node, ast.Constant):
            if node.value is None:
                return NONE
            if isinstance(node.value, int) and not isinstance(node.value, bool):
                return f"lit:cuda:{node.value}"
            return _string_device(node.value, self.cuda(node)) if isinstance(node.value, str) else None
        if isinstance(node, ast.Call) and self.resolve(node.func) == "torch.device":
            args = [*node.args, *(k.value for k in node.keywords if k.arg in ("type", "index"))]
            if len(args) == 1 and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                return _string_device(args[0].value, self.cuda(node))
            if len(args) == 2 and all(isinstance(a, ast.Constant) for a in args):
                a0, a1 = (a.value for a in args)  # type: ignore[attr-defined]
                return HOST if a0 == "cpu" else f"lit:{a0}:{a1}"
            if len(args) == 1:
                inner = self.dev(args[0], env)
                return inner.token if inner.token not in (_SCALAR, _DTYPE) else None
            return None
        token = self.dev(node, env).token
        return token if token not in (_SCALAR, _DTYPE, _EMPTY) else None

    def target(self, call: ast.Call, env: Env) -> str | None:
        """Where ``x.to(...)`` puts ``x``: a device token, ``"dtype"`` for a cast that keeps the device, or
        None (unknown, or a copy asked for)."""
        keywords = {k.arg: k.value for k in call.keywords}
        if None in keywords or "memory_format" in keywords:
            return None
        copy = keywords.get("copy")
        if copy is not None and not (isinstance(copy, ast.Constant) and copy.value is False):
            return None
        given = keywords.get("device")
        args = list(call.args)
        if given is None and args and not self.is_dtype(args[0], env):
            given = args[0]
        if given is None:
            return _DTYPE if args or "dtype" in keywords else None
        return self.device(given, env)

    def is_dtype(self, node: ast.expr, env: Env) -> bool:
        return self.dev(node, env).token == _DTYPE

    def call(self, node: ast.Call, env: Env, depth: int) -> Val:
        func = node.func
        keywords = {k.arg: k.value for k in node.keywords}
        for k in node.keywords:
            self.dev(k.value, env, depth)
        if isinstance(func, ast.Attribute):
            name = self.resolve(func)
            if name.startswith("torch.") and name.count(".") == 1 or name.startswith(_OP_NAMESPACES):
                return self.torch_call(node, name, keywords, env, depth)
            if name.startswith("torch."):
                for a in node.args:
                    self.dev(a, env, depth)
                return Val(self.fresh("call", node))
            return self.method(node, func, keywords, env, depth)
        args = [self.dev(a, env, depth) for a in node.args]
        if isinstance(func, ast.Name) and func.id not in env and func.id not in self.params:
            if func.id in _SCALAR_BUILTINS:
                return _SCALAR_VAL
            if func.id in _KEEPS_BUILTINS and len(args) == 1:
                return Val(args[0].token, args[0].uniform, func.id != "tuple")
            if func.id in ("dict", "set", "frozenset", "zip", "enumerate", "map", "filter"):
                return Val(self.fresh("call", node))
        self.escapes(node, env)
        if "return_tensors" in keywords and isinstance(keywords["return_tensors"], ast.Constant) \
                and keywords["return_tensors"].value == "pt":
            return Val(HOST, True)  # a tokenizer's output: host tensors
        return Val(self.fresh("call", node))

    def escapes(self, node: ast.Call, env: Env) -> None:
        """A list handed to a call of unknown code may be grown by it with anything."""
        for a in (*node.args, *(k.value for k in node.keywords)):
            key = self.key(a.value if isinstance(a, ast.Starred) else a)
            if key is not None and key in env and env[key].listy:
                env[key] = Val(self.fresh("escaped", node), False, True)

    def torch_call(self, node: ast.Call, name: str, keywords: dict[str | None, ast.expr], env: Env,
                   depth: int) -> Val:
        attr = name.rsplit(".", 1)[1]
        args = [self.dev(a, env, depth) for a in node.args]
        if None in keywords or "out" in keywords:
            return _UNKNOWN  # `**kwargs` that may hold a device, or an output buffer
        if name.count(".") == 1 and attr in _NOT_OPS:
            if attr == "device":
                token = self.device(node, env)
                return Val(token) if token is not None else _UNKNOWN
            return Val(self.fresh("call", node))
        if attr in _DTYPES:
            return Val(_DTYPE)
        given = keywords.get("device")
        if given is not None:
            token = self.device(given, env)
            if token == NONE:
                return self.default(env)
            return Val(token, True) if token is not None else _UNKNOWN
        if keywords.get("pin_memory") is not None and not (
                isinstance(keywords["pin_memory"], ast.Constant) and keywords["pin_memory"].value is False):
            return Val(HOST, True)
        if attr in _HOST_MAKERS:
            return Val(HOST, True)
        if attr.endswith("_like"):
            return Val(args[0].token, True) if args and args[0].token not in (_SCALAR, _DTYPE) else _UNKNOWN
        if attr in _FACTORIES:
            if attr in ("tensor", "Tensor") and node.args and not _data(node.args[0]) and not args[0].listy:
                token = args[0].token  # of a tensor: a copy where it is
                return Val(token, True) if args[0].uniform and token is not None else _UNKNOWN
            return self.default(env)
        if attr in _WRAPPERS:
            if node.args and _data(node.args[0]):
                return self.default(env)
            return Val(args[0].token, True) if args and args[0].uniform and args[0].token is not None else _UNKNOWN
        flat: list[Val] = []
        nodes: list[ast.expr] = []
        for a, v in zip(node.args, args, strict=True):
            if isinstance(a, (ast.List, ast.Tuple)):
                for e in a.elts:
                    flat.append(self.dev(e, env, depth))
                    nodes.append(e)
            else:
                flat.append(v if v.uniform or v.token is None or not v.listy else Val(None))
                nodes.append(a)
        return self.combine(flat, nodes)

    def default(self, env: Env) -> Val:
        where = env.get("<default>")
        return Val(where.token if where is not None else DEFAULT, True)

    def method(self, node: ast.Call, func: ast.Attribute, keywords: dict[str | None, ast.expr], env: Env,
               depth: int) -> Val:
        attr = func.attr
        receiver = self.dev(func.value, env, depth)
        args = [self.dev(a, env, depth) for a in node.args]
        if attr == "to":
            where = self.target(node, env)
            if where == _DTYPE:
                return Val(receiver.token, receiver.uniform) if receiver.token not in (_SCALAR, _EMPTY) else _UNKNOWN
            if where == NONE:
                return receiver
            return Val(where, receiver.uniform) if where is not None else _UNKNOWN
        if attr == "cuda":
            if None in keywords:
                return _UNKNOWN
            if node.args:
                token = self.device(node.args[0], env)
                return Val(token, receiver.uniform) if token is not None and token != NONE else _UNKNOWN
            given = keywords.get("device")
            if given is not None:
                token = self.device(given, env)
                return Val(token, receiver.uniform) if token is not None and token != NONE else _UNKNOWN
            return Val(self.cuda(node), receiver.uniform)
        if attr in ("cpu", "pin_memory"):
            return Val(HOST, receiver.uniform)
        if attr in ("eval", "train") and not node.keywords and len(node.args) <= 1:
            return receiver  # `model.eval()`: a module returns itself
        if attr in ("item", "tolist", "numpy", "size", "dim", "numel", "element_size", "data_ptr", "stride",
                    "nelement", "is_contiguous", "is_pinned", "get_device", "storage_offset", "nbytes"):
            return _SCALAR_VAL
        if receiver.token in (None, _SCALAR, _DTYPE, NONE) or receiver.listy and not receiver.uniform:
            self.escapes(node, env)
            return Val(self.fresh("call", node))
        if attr.startswith("new_") and attr in _STAYS:
            given = keywords.get("device")
            if given is not None:
                token = self.device(given, env)
                return Val(token, True) if token is not None and token != NONE else _UNKNOWN
            return Val(receiver.token, True)
        if attr == "type_as":
            return Val(receiver.token, True) if args and args[0].token == receiver.token else _UNKNOWN
        if attr in _STAYS and "device" not in keywords:
            return Val(receiver.token, True) if receiver.uniform else Val(receiver.token)
        self.escapes(node, env)
        return Val(self.fresh("call", node))

    # ------------------------------------------------------------ queries
    def env_at(self, call: ast.AST) -> Env | None:
        """The environment just before ``call`` runs: its statement's, with the targets of the
        comprehensions and lambdas around it bound."""
        chain: list[ast.AST] = []
        up: ast.AST | None = call
        while up is not None and not isinstance(up, ast.stmt):
            chain.append(up)
            up = self.parents.get(id(up))
        if up is None or id(up) not in self.before:
            return None
        env = dict(self.before[id(up)])
        for node in reversed(chain):
            if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)):
                for gen in node.generators:
                    self.bind_element(gen.target, self.element(gen.iter, env), node, env)
            elif isinstance(node, ast.Lambda):
                for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                    env[a.arg] = Val(self.fresh(f"lambda:{a.arg}", node))
        return env


def _string_device(text: str, cuda: str) -> str | None:
    text = text.strip()
    if text == "cpu" or text.startswith("cpu:"):
        return HOST
    if text == "cuda":
        return cuda
    if re.fullmatch(r"(?:cuda|xpu|npu|mps|hpu|meta|mlu|musa|privateuseone)(?::\d+)?", text):
        return f"lit:{text}"
    return None


def _none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _ellipsis(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def _data(node: ast.expr) -> bool:
    """Data written out, no tensor: a number, a list or tuple display or comprehension."""
    return isinstance(node, (ast.Constant, ast.List, ast.Tuple, ast.ListComp))


# ---------------------------------------------------------------- the sites' questions

def _flow(ext: PythonExtractor, node: Any) -> tuple[Flow, ast.Call] | None:
    """The flow of the function around the tree-sitter call ``node`` (the module's top level outside any),
    and the ``ast`` call at its position."""
    body = enclosing(node.parent, "function_definition")
    if body is None and enclosing(node.parent, "class_definition") is not None:
        return None
    key = body.start_byte if body is not None else -1
    cache = ext.device_flows
    if key not in cache:
        cache[key] = _build(ext, body)
    built = cache[key]
    if built is None:
        return None
    flow, calls, row0, shifts = built
    (row, col), (end_row, end_col) = node.start_point, node.end_point
    line, end = row - row0 + 1, end_row - row0 + 1
    if line == 1 and body is not None:
        return None  # a call in the `def` line (a default value): runs where the function is defined
    # a chain's calls start together (`torch.empty_like(x).contiguous()`): the end tells them apart
    found = calls.get((line, col - shifts.get(line, 0), end, end_col - shifts.get(end, 0)))
    return (flow, found) if found is not None else None


def _build(ext: PythonExtractor, body: Any) -> tuple[Flow, dict[tuple[int, int, int, int], ast.Call], int, dict[int, int]] | None:
    data = ext.src.data
    if body is None:
        start, end, row0, indent = 0, len(data), 0, 0
    else:
        start, end = body.start_byte, body.end_byte
        row0, indent = body.start_point
    if end - start > 400_000:
        return None
    lines = data[start:end].decode("utf-8", "replace").split("\n")
    shifts: dict[int, int] = {}
    out = [lines[0]]
    for number, line in enumerate(lines[1:], 2):
        cut = min(indent, len(line) - len(line.lstrip(" \t")))
        shifts[number] = cut
        out.append(line[cut:])
    source = "\n".join(out)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    fn: ast.AST = tree
    if body is not None:
        if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        fn = tree.body[0]
    params, dtypes = _params(fn)
    try:
        flow = Flow(ext, fn, params, dtypes, source)
    except RecursionError:
        return None
    calls: dict[tuple[int, int, int, int], ast.Call] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and n.end_lineno is not None and n.end_col_offset is not None:
            # a tree-sitter column counts bytes, as `col_offset` does
            calls.setdefault((n.lineno, n.col_offset, n.end_lineno, n.end_col_offset), n)
    return flow, calls, row0, shifts


def _params(fn: ast.AST) -> tuple[frozenset[str], frozenset[str]]:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return frozenset(), frozenset()
    a = fn.args
    every = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x is not None)]
    defaults = dict(zip([x.arg for x in [*a.posonlyargs, *a.args]][::-1], a.defaults[::-1], strict=False))
    defaults.update({x.arg: d for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None})
    dtypes = set()
    for x in every:
        note = ast.unparse(x.annotation) if x.annotation is not None else ""
        default = ast.unparse(defaults[x.arg]) if x.arg in defaults else ""
        if re.fullmatch(r"(?:Optional\[)?torch\.dtype\]?(?:\s*\|\s*None)?", note) or \
                default.startswith("torch.") and default[6:] in _DTYPES:
            dtypes.add(x.arg)
    return frozenset(x.arg for x in every), frozenset(dtypes)


def noop_move(ext: PythonExtractor, node: Any) -> bool:
    """``x.to(E)`` / ``x.cuda()`` (the tree-sitter call ``node``) copies nothing onto a device: ``x`` is
    already where ``E`` is, or ``E`` is the host or ``None``."""
    found = _flow(ext, node)
    if found is None:
        return False
    flow, call = found
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in ("to", "cuda"):
        return False
    env = flow.env_at(call)
    if env is None:
        return False
    if func.attr == "to":
        if len(call.args) > 1 or any(k.arg == "dtype" for k in call.keywords):
            return False  # a dtype given with the device: a cast, which copies
        where = flow.target(call, env)
    elif call.args or call.keywords and any(k.arg != "non_blocking" for k in call.keywords):
        return False
    else:
        where = flow.cuda(call)
    if where is None or where == _DTYPE:
        return False
    if where in (HOST, NONE):
        return True
    value = flow.dev(func.value, env)
    return value.token == where


def copied_device(ext: PythonExtractor, node: Any, which: str) -> str | None:
    """The token of what the factory ``node`` takes its device from (``which``: ``"first"``, the first
    argument of a ``*_like``; ``"receiver"``, of ``x.new_zeros``; ``"device"``, the ``device=`` given):
    ``HOST``, ``DEFAULT``, another token, or None."""
    found = _flow(ext, node)
    if found is None:
        return None
    flow, call = found
    env = flow.env_at(call)
    if env is None:
        return None
    if which == "first":
        if not call.args or isinstance(call.args[0], ast.Starred):
            return None
        return flow.dev(call.args[0], env).token
    if which == "receiver":
        return flow.dev(call.func.value, env).token if isinstance(call.func, ast.Attribute) else None
    given = next((k.value for k in call.keywords if k.arg == "device"), None)
    if given is None:
        return None
    token = flow.device(given, env)
    return DEFAULT if token == NONE else token
