"""Stage 3, extract (Python): the values of ``python_device_flow``'s walk --
device tokens, what an expression's device is (a name, an attribute chain, a
subscript, an op, a literal device) -- and its constants. Pure.
"""


from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .python import PythonExtractor

HOST = "host"
DEFAULT = "default"
NONE = "none"  # `.to(None)`: returns the tensor itself
_EMPTY = "empty"  # a list with no element yet: no device to disagree with
_SCALAR = "scalar"  # no tensor: a number, a shape, a dtype, a string
_DTYPE = "dtype"
# round 35: the host or one other device, by a branch (`"cpu" if flag else "cuda"`); a value moved there from
# that other device stays off the GPU either way (`python_device_flow.noop_move`)
HOST_OR = "hostor"
_NOT_PLACED = frozenset({None, HOST, DEFAULT, "scalar", "dtype", "none", "empty"})
_POS = re.compile(r"@(\d+):(\d+)")
_LOOP_PASSES = 3
_DEPTH = 40  # expression nesting followed
_LINES = 150  # the longest function (or module top level) walked


# what a function above a copy spells when a value there can be a host tensor
_HOSTS = (b"cpu", b"from_numpy", b"frombuffer", b"return_tensors", b"pin_memory", b"load_file")
# round 32: or a tensor on the default device (a torch factory called without a device, where the call's
# arguments fit on its line: `torch.arange(0, n, 2)`, `torch.tensor(vals)`)
_DEFAULTS = re.compile(rb"torch\.(?:arange|zeros|ones|empty|full|rand|randn|randint|randperm|linspace|eye|tensor|"
                       rb"Tensor|\w+Tensor)\((?![^\n]*device)")


def _too_long(src: bytes, body: Any) -> bool:
    """The function ``body`` (None: the top level of the module ``src``) has more than ``_LINES`` lines:
    not walked (round 33: asked before the text above a site is read; a class body outside any method is
    not walked either, and ``python_device_flow._before`` skips it too)."""
    return bool((body.end_point[0] - body.start_point[0] if body is not None else src.count(b"\n")) > _LINES)


def _producer(text: bytes) -> bool:
    """The text spells a value a copy of which can stay off the GPU: a host producer or a factory given
    no device (round 32)."""
    return any(n in text for n in _HOSTS) or _DEFAULTS.search(text) is not None


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
# Python's types a tensor's `to` takes as dtypes (`x.to(float)`: torch.float64)
_PY_DTYPES = frozenset({"float", "int", "bool", "complex"})
# context managers that place nothing
_NO_PLACEMENT = re.compile(r"(?:torch\.)?(?:no_grad|inference_mode|enable_grad|set_grad_enabled|autocast|"
                           r"amp\.autocast|cuda\.amp\.autocast|profiler\.\w+|autograd\.\w+)\b|"
                           r"(?:\w+\.)?assert\w+|pytest\.\w+|warnings\.\w+|open\b|contextlib\.\w+|nullcontext\b|"
                           r"tqdm\b|timer\b|self\.assert\w+")
# every match spells `device(` or `device_of(`: `Flow` searches (the pattern has no literal start, so it
# is tried at every offset) only a function whose text holds one (round 33)
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
_Calls = dict[tuple[int, int, int, int], ast.Call]  # (line, column, end line, end column): the call there


def _asked(call: ast.Call, hosts: bool) -> bool:
    """A call the sites may ask about: a move; where the function spells a host producer (``hosts``), a
    `*_like` or `new_*`, a factory given a device."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("to", "cuda"):
        return True
    if not hosts:
        return False
    if isinstance(func, ast.Attribute) and (func.attr.endswith("_like") or func.attr.startswith("new_")):
        return True
    return any(k.arg == "device" for k in call.keywords)


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


class _Values:
    """What an expression's device token is, given the environment before it (``python_device_flow``)."""

    ext: PythonExtractor
    params: frozenset[str]
    dtypes: frozenset[str]
    scalars: frozenset[str]
    switches: bool
    volatile: set[str]
    bound: set[str]
    loops: list[_Loop]

    def bind(self, target: ast.expr, value: Val, node: ast.expr | None, env: Env) -> None:
        raise NotImplementedError

    def bind_element(self, target: ast.expr, element: list[Val] | Val | None, node: ast.AST, env: Env) -> None:
        raise NotImplementedError

    def element(self, it: ast.expr, env: Env) -> list[Val] | Val | None:
        raise NotImplementedError

    def call(self, node: ast.Call, env: Env, depth: int) -> Val:
        raise NotImplementedError

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
        if name in self.scalars:
            return _SCALAR_VAL
        if name in self.params:
            return Val(f"param:{name}")
        if name in self.bound:
            return _UNKNOWN  # a local not bound on this path yet
        if name in _PY_DTYPES:
            return Val(_DTYPE)  # round 33: `x.to(float)` casts (float64), it names no device
        return Val(f"free:{name}")

    def key(self, node: ast.expr) -> str | None:
        """The environment key of a name or an attribute chain (``self.buf``)."""
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = self.key(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        return None

    def fresh(self, what: str, node: ast.AST) -> str:
        return f"{what}@{getattr(node, 'lineno', 0)}:{getattr(node, 'col_offset', 0)}"

    def cuda(self, node: ast.AST) -> str:
        return self.fresh("cuda", node) if self.switches else "cuda"

    def default(self, env: Env) -> Val:
        where = env.get("<default>")
        return Val(where.token if where is not None else DEFAULT, True)

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
            for host, other in ((a, b), (b, a)):  # round 35: `"cpu" if c else d`, a host or `d` (`HOST_OR`)
                if host.token == HOST and other.token not in _NOT_PLACED and not other.listy:
                    return Val(f"{HOST_OR}@{node.lineno}:{node.col_offset}={other.token}")
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
            if len(args) == 2 and isinstance(args[0], ast.Constant) and args[0].value == "cuda" \
                    and isinstance(args[1], ast.Name):
                # round 33: `torch.device("cuda", i)` runs only for an int `i`, the device `.to(i)` names
                token = self.device(args[1], env)
                return token if token is not None and token.startswith("param:") else None
            if len(args) == 1:
                inner = self.dev(args[0], env)
                return inner.token if inner.token not in (_SCALAR, _DTYPE) else None
            return None
        if isinstance(node, ast.Name) and node.id in self.scalars and node.id not in env:
            return f"param:{node.id}"  # `device=rank` of `rank: int`, `device: str`: a device, not a tensor's
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


# round 32: a parameter annotated as a number, a flag or a string holds no tensor
_SCALAR_NOTE = re.compile(r"(?:Optional\[)?(?:int|float|bool|str)\]?(?:\s*\|\s*None)?")


def params_of(fn: ast.AST) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """A function's parameters, those that are dtypes, and those annotated as no tensor (round 32)."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return frozenset(), frozenset(), frozenset()
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
    scalars = frozenset(x.arg for x in every if x.annotation is not None and x not in (a.vararg, a.kwarg)
                        and _SCALAR_NOTE.fullmatch(ast.unparse(x.annotation)))
    return frozenset(x.arg for x in every), frozenset(dtypes), scalars
