"""Python calls and census sites: every call with its callee (aliases resolved) and argument text, the sites
among them with kind, device, shape and target, then the sites handed to a call (``wrapper``) or exported (IPC).
Part of the Python extractor (``python.py``)."""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...arglists import split_args, split_top_level
from ...catalog import ApiSpec
from ...model import Arg, CallTable, Site, SiteKind
from . import common, python_default_copies, python_guards, python_host, python_tensorless
from .common import Source
from .dead_code import after_exit
from .python_device_flow import host_copy, host_device, noop_move
from .python_empty import empty_guarded
from .python_fake import in_fake_scope
from .python_host import host_source, on_current_gpu, to_one_device
from .python_host_defaults import copied_source
from .python_host_kernel import in_host_kernel
from .python_module_move import dispatches_to_super, moves_module
from .python_runtime import runtime_handle
from .python_same_device import on_device_of, source_device, storage_alias
from .python_scratch import constructor_temporary, dropped_in_chain, dtype_of, module_temporary
from .python_typeonly import in_type_checking

if TYPE_CHECKING:
    from .python import PythonExtractor

ARGLIST_CAP = 1000
_STRING_LITERAL = re.compile(r"""^[rbuRBU]{0,2}(['"])(.*)\1$""", re.S)
_FSTRING = re.compile(r"""^[fF][rR]?(['"])(.*)\1$""", re.S)
STRING_LITERAL = _STRING_LITERAL
DEFAULT_DEVICE = "default"  # no device given: the default device where the call runs
# `pin_memory=kwargs.get("pin_memory", False)`: the caller's setting forwarded, off by default: not pinned
_FORWARDED_OFF = re.compile(r"""[\w.]+\.get\(\s*['"]\w+['"]\s*(?:,\s*(?:False|None)\s*)?\)""")
_DICT_DEVICE = re.compile(r"""(?:\bdevice\s*=|["']device["']\s*:)\s*([^,)}\n]+)""")
# `.to(x)` copies to a device when x names one: `device`, `self.device`,
# `target_dev`, `x.device`, `torch.device(...)` (never a dtype or a tensor)
_DEVICE_NAME = re.compile(r"(?:^|[._])(?:[a-z_]*_)?(?:device|dev)s?(?:\[[^\]]*\])?(?:\(\))?$|^torch\.device\(")
_CONSTRUCTORS = frozenset({"__init__", "__post_init__", "__new__"})
_DEVICE_OF = re.compile(r"([A-Za-z_]\w*)\.device")
_REGISTRATION = re.compile(r"(?:Parameter|register_buffer|register_parameter)$")


def _copy_device(candidates: list[str]) -> str | None:
    """The device a `.to(...)` copy goes to: ``cuda`` for a literal CUDA
    device, ``unknown`` for a device held in a variable, attribute or
    parameter, None when it is not a device copy (a dtype, the CPU, a
    tensor)."""
    found = None
    for text in candidates:
        if not text:
            continue
        device = classify_device(text)
        if device == "cuda":
            return "cuda"
        if device == "unknown" and _DEVICE_NAME.search(text.strip()) and "cpu" not in text:
            found = "unknown"
    return found


def classify_device(arg: str) -> str:
    """``cuda``, ``cpu``, ``meta`` or ``unknown`` for a device expression."""
    value = arg.strip()
    m = _STRING_LITERAL.match(value) or _FSTRING.match(value)
    if m is None:
        inner = re.match(r"^torch\.device\((.*)\)$", value, re.S)
        if inner:
            first = inner.group(1).split(",")[0].strip()
            m = _STRING_LITERAL.match(first) or _FSTRING.match(first)
            if m is None:
                return "unknown"
        elif value.isdigit() or re.fullmatch(r"torch\.cuda\.current_device(\(\))?", value):
            return "cuda"
        else:
            return "unknown"
    literal = m.group(2).strip().lower()
    for name in ("cuda", "cpu", "meta"):
        if literal == name or literal.startswith(name + ":") or literal.startswith(name + "{"):
            return name
    return "unknown"


def _shape(mode: str, positional: list[str], kwargs: dict[str, str]) -> tuple[tuple[str, ...], str | None]:
    if "size" in kwargs:
        return _dims(kwargs["size"]), kwargs["size"]
    if mode == "none" or not positional:
        return (), None
    if mode == "positional":
        if len(positional) == 1:
            return _dims(positional[0]), positional[0]
        return tuple(positional), "(" + ", ".join(positional) + ")"
    if mode == "first":
        return _dims(positional[0]), positional[0]
    index = int(mode[4:])
    if index < len(positional):
        return (positional[index],), positional[index]
    return (), None


def _dims(expr: str) -> tuple[str, ...]:
    """Split a shape literal `(a, b)` / `[a, b]` / `torch.Size([a, b])` into dims."""
    e = expr.strip()
    m = re.fullmatch(r"torch\.Size\((.*)\)", e, re.S)
    if m:
        e = m.group(1).strip()
    if len(e) >= 2 and e[0] + e[-1] in ("()", "[]"):
        inner = e[1:-1]
        parts = split_top_level(inner)
        if len(parts) > 1 or inner.rstrip().endswith(","):
            return tuple(p for p in parts if p)
        return (inner.strip(),) if e[0] == "[" else (e,)
    return (e,)


def _strip_byref(arg: str) -> str:
    m = re.fullmatch(r"(?:ctypes\.)?(?:byref|pointer|addressof)\((.*)\)", arg.strip(), re.S)
    return m.group(1).strip() if m else arg.strip()


def _target_of(node: Any, src: Source, parent_of: Callable[[Any], Any | None]) -> str | None:
    """The assignment target that receives a call's value: the call may be the
    right-hand side itself or the start of a method chain on it
    (``self.buf = torch.empty(n).view(a, b)``)."""
    child = node
    parent = parent_of(node)
    while parent is not None:
        t = parent.type
        if t == "assignment":
            if parent.child_by_field_name("right") == child:
                left = parent.child_by_field_name("left")
                return src.text(left) if left is not None else None
            return None
        if t == "attribute" and parent.child_by_field_name("object") == child:
            child = parent
            parent = parent_of(parent)
            if parent is not None and parent.type == "call" and parent.child_by_field_name("function") == child:
                child = parent
                parent = parent_of(parent)
            continue
        if t in ("parenthesized_expression", "await"):
            child, parent = parent, parent_of(parent)
            continue
        if t == "pair" and parent.child_by_field_name("value") == child:
            child, parent = parent, parent_of(parent)  # `{k: torch.empty(...) for k in ...}`
            continue
        if t in _COMPREHENSIONS and parent.child_by_field_name("body") == child:
            child, parent = parent, parent_of(parent)  # every element: kept where the whole goes
            continue
        return None
    return None


_COMPREHENSIONS = frozenset({"list_comprehension", "set_comprehension", "dictionary_comprehension"})


def calls(ext: PythonExtractor, call_nodes: list[Any], with_nodes: list[Any]) -> tuple[CallTable, list[Site]]:
    scopes: list[str] = []
    callees: list[str] = []
    arglists: list[str] = []
    targets: list[str | None] = []
    positions: list[int] = []
    sites: list[Site] = []
    apis = ext.apis
    names, leaves, methods = apis.py_names, apis.py_leaf, apis.py_methods
    src = ext.src
    data = src.data
    innermost = ext.containers.innermost
    qualnames = ext.qualnames
    aliases = ext.aliases
    span_of = src.span
    col = src.col
    ascii_file = src.ascii
    wide_rows = src.wide_rows()
    rhs_targets = ext.rhs_targets
    for node in call_nodes:
        kids = node.children
        if len(kids) < 2:
            continue
        fn, args_node = kids[0], kids[-1]
        fn_type = fn.type
        if fn_type == "identifier":
            raw = data[fn.start_byte:fn.end_byte].decode("utf-8", "replace")
            resolved = aliases.get(raw, raw)
            callee, leaf = resolved, raw
            dotted: str | None = resolved
        else:
            callee, dotted, leaf = ext.callee_of(fn)
        start = node.start_byte
        index = innermost(start)
        scope = qualnames[index] if index >= 0 else "<module>"
        arglist = ""
        a0, a1 = args_node.start_byte, args_node.end_byte
        if a1 - a0 > 2:
            if args_node.type == "argument_list":
                arglist = data[a0 + 1:min(a1 - 1, a0 + 1 + ARGLIST_CAP)].decode("utf-8", "replace")
            else:  # a generator argument: f(x for x in y)
                arglist = data[a0:min(a1, a0 + ARGLIST_CAP)].decode("utf-8", "replace")
        target = rhs_targets.get(start)
        scopes.append(scope)
        callees.append(callee)
        arglists.append(arglist)
        targets.append(target)
        (r0, c0), (r1, c1) = node.start_point, node.end_point
        if ascii_file or (r0 not in wide_rows and r1 not in wide_rows):
            positions += (r0 + 1, c0 + 1, r1 + 1, c1 + 1)
        else:
            positions += (r0 + 1, col(c0, start), r1 + 1, col(c1, node.end_byte))
        spec = names.get(dotted) if dotted else None
        if spec is None and leaf:
            spec = leaves.get(leaf)
            if spec is None and fn_type == "attribute":
                spec = methods.get(leaf)
        if spec is None:
            continue
        args = call_args(src, args_node) if args_node.type == "argument_list" else ()
        if target is None:
            target = _target_of(node, src, ext.up.parent)  # a method chain on the allocation
        site = make_site(ext, node, spec, scope, span_of(node), args, target)
        if site is not None:
            sites.append(site)
    return CallTable(tuple(scopes), tuple(callees), tuple(arglists), tuple(targets), tuple(positions)), sites


def make_site(ext: PythonExtractor, node: Any, spec: ApiSpec, scope: str, span: Any, args: tuple[Arg, ...],
              target: str | None) -> Site | None:
    if ext.fake_file and in_fake_scope(ext, node):
        return None  # a fake/meta impl or a FakeTensorMode block: fake tensors, no memory
    if ext.gpus_hidden or ext.host_kernel_file and in_host_kernel(ext, node):
        return None  # a kernel registered only for the "cpu" device, a file hiding every GPU: host memory
    if ext.type_level or (ext.type_checking_file and in_type_checking(ext, node)) or after_exit(ext.dead, node):
        return None  # code only a type checker reads, or after an unconditional raise/return: never runs
    kwargs = {a.keyword: ext.resolve_text(a.text) for a in args if a.keyword}
    positional = [ext.resolve_text(a.text) for a in args if a.keyword is None and not a.text.startswith("**")]
    if spec.api.startswith("Tensor.new_") and not positional and not {"size", "data"} & kwargs.keys() \
            and not any(a.text.startswith("**") for a in args):
        return None  # `graph.new_tensor(dims=d, name=n)`: torch's `new_*` take a size or data; another class's method
    kind, mode = spec.kind, spec.device
    device: str | None = None
    if mode == "loader" and not common.placed(kwargs.get(spec.device_keyword)):
        return None  # `torch.load(f)`: where each tensor was saved, which the code does not say
    if mode in ("keyword", "inherit", "loader"):
        pin, dev_text = kwargs.get("pin_memory"), kwargs.get(spec.device_keyword)
        if pin is not None and pin.strip() != "False" and not _FORWARDED_OFF.fullmatch(pin.strip()):
            kind = SiteKind.PINNED_HOST
            device = "cpu" if pin.strip() == "True" else "cpu (pinned if " + pin.strip() + ")"
        elif dev_text is None:
            spread = [a.text[2:].strip() for a in args if a.keyword is None and a.text.startswith("**")]
            if spread:
                # `torch.empty(n, **factory_kwargs)`: the device the dict holds
                device = _spread_device(ext, spread[-1], node.start_byte)
            else:
                device = DEFAULT_DEVICE if mode == "keyword" else "unknown"
            if device in (None, "cpu", "meta"):
                return None
            if mode == "inherit" and ext.host_test_file:
                return None  # a copy of a tensor in a test file that never names a device: host
            copied = copied_source(node, spec.api, positional, lambda n: ext.src.text(n, 400)) \
                if mode == "inherit" else None
            if copied is not None:  # `torch.zeros_like(x)`, `x.new_zeros(n)`: where `x` is
                if host_source(ext, node, copied) or host_copy(ext, node, spec.api.startswith("torch.")):
                    return None  # `torch.zeros_like(enc["input_ids"])` of a tokenizer's output: a host tensor
                if spec.api.startswith("torch.") and ext.empty_guard_file and empty_guarded(ext, node, copied):
                    return None  # `empty_like(A)` under `if A.numel() == 0:`: zero elements, no memory
                if python_default_copies.default_copied(ext, node, copied, spec.api.startswith("torch.")):
                    device = DEFAULT_DEVICE  # `torch.ones_like(torch.arange(n))`: where the default device is
        else:
            device = classify_device(dev_text)
            if device in ("cpu", "meta") or (scope, dev_text.strip()) in ext.host_locals:
                return None
            source = _DEVICE_OF.fullmatch(dev_text.strip())
            if source is not None and ext.host_test_file:
                return None  # `device=x.device` in a test file that never names a device: host
            if source is not None and host_source(ext, node, source.group(1)):
                return None  # `device=sample.device` of a tensor made on the host in the function
            if python_default_copies.default_given(ext, node, source, device, dev_text):
                device = DEFAULT_DEVICE  # `device=x.device` of `x = torch.randn(n)`: the default device
            if under_cpu_branch(ext.src, node, dev_text.strip()) or host_device(ext, node, device, dev_text):
                return None  # round 30: also `device=d` of a host `d` (python_device_flow)
    elif mode == "to-args":
        if any(k not in _TO_KEYWORDS for k in kwargs):
            return None  # `engine.to(device, model=True, optimizer=True)`: another class's own `to`
        fn = node.children[0]
        receiver = fn.child_by_field_name("object") if fn.type == "attribute" else None
        if receiver is not None and common.zero_element_receiver(ext.src.text(receiver, 120)):
            return None  # `torch.empty(0, 4).to(device)`: zero elements, nothing copied
        own = f"{ext.src.text(receiver, 80)}.device" if receiver is not None else ""
        wanted = [c for c in (*positional[:1], kwargs.get("device", "")) if c != own]  # `x.to(x.device)`: no copy
        device = source_device(ext, node, wanted, _copy_device(wanted))  # `y.to(x.device)`: where `x` was made
        if device is None or (wanted and under_cpu_branch(ext.src, node, wanted[0].strip())):
            return None
        target_device = to_one_device(positional, kwargs)
        if receiver is not None and target_device is not None \
                and on_current_gpu(ext, node, ext.src.text(receiver, 80), target_device):
            return None  # `x.to("cuda")` / `x.to(device)` of a tensor the function already put there: no copy
        if receiver is not None and (target_device is not None and on_device_of(
                ext, node, ext.src.text(receiver, 400), target_device) or noop_move(ext, node)):
            return None  # `(x == pad).to(x.device)`: made from `x`, already where `x` is (round 30: python_device_flow)
    elif mode == "cuda":
        device = "cuda"
        fn = node.children[0]
        receiver = fn.child_by_field_name("object") if fn.type == "attribute" else None
        if receiver is not None and not positional and set(kwargs) <= {"non_blocking"} \
                and (on_current_gpu(ext, node, ext.src.text(receiver, 80)) or noop_move(ext, node)):
            return None  # `x.cuda()` of a tensor the function already put there: no copy
    shape, size = _shape(spec.shape, positional, kwargs)
    if python_guards.no_elements(ext.src, node, spec.api, shape) or storage_alias(spec.api, positional, kwargs) \
            or python_tensorless.builds_nothing(ext, node, spec.api, positional, kwargs, args):
        return None  # `torch.empty(0)`, `.set_(storage)`, a storage view, `LayerNorm(d, elementwise_affine=False)`
    if spec.target.startswith("arg:"):
        index = int(spec.target[4:])
        if len(positional) > max(index, 1):
            target = _strip_byref(positional[index])
        else:  # cuda-python returns the pointer: `err, ptr = cudart.cudaMalloc(n)`
            shape, size = ((positional[-1],), positional[-1]) if positional else ((), None)
            if target and "," in target:
                target = target.rsplit(",", 1)[1].strip()
    api = spec.api
    if mode in ("to-args", "cuda") and (dispatches_to_super(ext, node)
                                         or api.startswith("Tensor.") and runtime_handle(ext, node)):
        return None  # `super().to(device)` in a class's own `to`: method dispatch; `tvm.cuda(0)`: a device handle
    if mode in ("to-args", "cuda") and api.startswith("Tensor.") and moves_module(ext, node):
        api = "Module." + api[len("Tensor."):]  # the whole model or layer: a weight upload (rules/tiers.toml)
    site = ext.at.site(node, api, kind, scope, span, size, shape, device, target, wrapper(ext, node),
                       dtype=kwargs.get("dtype"))
    if target is None and (scope.rsplit(".", 1)[-1] in _CONSTRUCTORS
                           and constructor_temporary(ext, node, site.wrapper, mode != "to-args")
                           or scope == "<module>" and module_temporary(ext, node, site.wrapper)):
        # `torch.rand(n) * k` in a constructor, `y.backward(torch.ones_like(y))` at module level: dropped at once
        return dataclasses.replace(site, wrapper=None, kept="local")
    if kind is SiteKind.DEVICE and dropped_in_chain(ext, node, dtype_of(api, site.dtype)):
        # `torch.Tensor(v).cuda().to(torch.int64).abs()`: the chain ends in a new tensor, this copy is dropped
        return dataclasses.replace(site, target=None, wrapper=None, kept="local")
    return site


# the keywords `Tensor.to` and `nn.Module.to` accept
_TO_KEYWORDS = frozenset({"device", "dtype", "non_blocking", "copy", "memory_format", "tensor"})


def _cpu_test(name: str) -> re.Pattern[str]:
    dev = re.escape(name)
    return re.compile(rf"""(?<![\w.]){dev}(?:\.type)?\s*==\s*(?:torch\.device\(\s*)?["']cpu["']""")


def under_cpu_branch(src: Source, node: Any, device: str) -> bool:
    """Whether ``node`` sits in the body of an ``if``/``elif`` whose test says ``device`` is the CPU (``device.type
    == "cpu"``, ``SYSTEM == "ipex" and device == torch.device("cpu")``; ``or``/``not`` prove nothing), ``device``'s
    last binding above is the CPU, or a guard above returns unless it is (``python_guards``): a host tensor."""
    if not device.isidentifier() and not re.fullmatch(r"[\w.]+", device):
        return False
    pattern: re.Pattern[str] | None = None  # compiled on the first test that names the device
    child = node
    parent = node.parent
    while parent is not None and parent.type not in ("function_definition", "class_definition", "module"):
        if parent.type in ("if_statement", "elif_clause"):
            body = parent.child_by_field_name("consequence")
            test = parent.child_by_field_name("condition")
            if (body is not None and test is not None and body.start_byte <= child.start_byte
                    and child.end_byte <= body.end_byte):
                text = src.text(test, 400)
                if device in text and not re.search(r"\b(?:or|not)\b", text):
                    pattern = pattern or _cpu_test(device)
                    if pattern.search(text):
                        return True
        child = parent
        parent = parent.parent
    return python_host.cpu_device_local(src, node, device) or python_guards.cpu_only_below(src, node, device)


def _spread_device(ext: PythonExtractor, name: str, before: int) -> str | None:
    """The device a `**name` spread carries: from the last
    `name = dict(device=...)` / `name = {"device": ...}` above the call;
    a dict without a device adds none (None: a host tensor); a name bound
    nowhere in the file (a `**kwargs` parameter) may carry one (unknown)."""
    if not name.isidentifier():
        return "unknown"
    data = ext.src.data
    found = None
    for m in re.finditer(rb"\b" + name.encode() + rb"\s*(?::[^=\n]*)?=\s*(dict\(|\{)", data[:before]):
        found = m
    if found is None:
        return "unknown"
    body = data[found.end():found.end() + 400].decode("utf-8", "replace")
    dev = _DICT_DEVICE.search(body)
    if dev is None:
        return None
    return classify_device(ext.resolve_text(dev.group(1)))


def wrapper(ext: PythonExtractor, node: Any) -> str | None:
    """The callee the allocation is passed to as an argument, if any."""
    up = ext.up.parent
    fn = common.wrapping_call(node, "call", "keyword_argument", parent_of=up)
    if fn is not None:
        return ext.callee_of(fn)[0]
    # through the expression that makes the registered tensor:
    # `nn.Parameter(scale * torch.ones(n))`,
    # `self.register_buffer("ids", torch.arange(n).expand((1, -1)))`
    inner = node
    for _ in range(6):
        parent = up(inner)
        if parent is None:
            return None
        if parent.type in ("binary_operator", "parenthesized_expression", "unary_operator"):
            inner = parent
        elif parent.type == "attribute" and (call := up(parent)) is not None and call.type == "call":
            inner = call  # a method chain on it
        else:
            break
    if inner is node:
        return None
    fn = common.wrapping_call(inner, "call", "keyword_argument", parent_of=up)
    if fn is None:
        return None
    callee = ext.callee_of(fn)[0]
    return callee if _REGISTRATION.search(callee) else None


def mark_handed(ext: PythonExtractor, sites: list[Site], calls: CallTable) -> list[Site]:
    """An allocation kept in a local and then passed whole to a call in
    the same scope is handed to that call, as if wrapped by it
    (`w = torch.empty(...)` ... `ext.register_all_parameters(w)` is
    `nn.Parameter(torch.empty(...))` in two steps): the first such call
    after it becomes its ``wrapper``."""
    pending = [s for s in sites if s.wrapper is None and s.target and s.target.isidentifier()]
    if not pending:
        return sites
    wanted: dict[str, set[str]] = {}
    for site in pending:
        wanted.setdefault(site.scope, set()).add(site.target or "")
    # Per (scope, name): the calls taking that name as a whole argument,
    # in call order, found in one pass over the calls; each site then
    # bisects for the first one after it. (Looping over the scope's calls
    # per site was quadratic: 20 s for a function of 8,000 allocations.)
    takers: dict[tuple[str, str], list[int]] = {}
    for i, scope in enumerate(calls.scopes):
        targets = wanted.get(scope)
        if not targets:
            continue
        arglist = calls.arglists[i]
        words = targets.intersection(_WORDS.findall(arglist))
        if words:
            for word in words.intersection(a.text for a in split_args(arglist, False)):
                takers.setdefault((scope, word), []).append(i)
    lines = {key: [calls.line(i) for i in found] for key, found in takers.items()}
    ordered = {key: all(a <= b for a, b in zip(ln, ln[1:])) for key, ln in lines.items()}
    handed: dict[int, str] = {}
    for site in pending:
        key = (site.scope, site.target or "")
        found = takers.get(key)
        if not found:
            continue
        at = _first_after(lines[key], site.span.end_line, ordered[key])
        if at is not None:
            handed[id(site)] = calls.callees[found[at]]
    return [dataclasses.replace(s, wrapper=handed[id(s)]) if id(s) in handed else s for s in sites]


_WORDS = re.compile(r"\w+")


def _first_after(lines: list[int], line: int, ordered: bool) -> int | None:
    """The index of the first entry greater than ``line``: bisect when the
    lines are in order (calls come in document order), else scan."""
    if ordered:
        at = bisect.bisect_right(lines, line)
        return at if at < len(lines) else None
    return next((i for i, value in enumerate(lines) if value > line), None)


def mark_exports(ext: PythonExtractor, sites: list[Site], calls: CallTable) -> list[Site]:
    """A site whose memory is passed to an export call in its scope is IPC."""
    exports = ext.apis.py_exports
    if not exports or not sites:
        return sites
    exported: dict[str, set[str]] = {}
    for i, callee in enumerate(calls.callees):
        if callee.rsplit(".", 1)[-1] in exports:
            words = set(re.findall(r"[A-Za-z_][\w.]*", calls.arglists[i]))
            words.add(callee.rsplit(".", 1)[0])
            exported.setdefault(calls.scopes[i], set()).update(words)
    return common.mark_exported(sites, exported) if exported else sites


def call_args(src: Source, node: Any) -> tuple[Arg, ...]:
    out = []
    for child in node.named_children:
        if child.type == "keyword_argument":
            name = child.child_by_field_name("name")
            value = child.child_by_field_name("value")
            out.append(Arg(src.raw(name) if name is not None else None, src.text(value) if value is not None else ""))
        elif child.type != "comment":
            out.append(Arg(None, src.text(child)))
    return tuple(out)
