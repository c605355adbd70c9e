"""C++/CUDA calls and census sites: calls (free, member, ``new``,
constructions in declarations) with their callee and argument text, the
sites among them with kind, device, size and target, then exported (IPC)
sites. Part of the C++ extractor (``cpp.py``)."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from ...arglists import pointer_target, split_top_level
from ...catalog import ApiSpec
from ...model import Arg, Assign, Call, Site, SiteKind
from . import common, cpp_host, cpp_host_options
from .common import Source, zero_elements
from .cpp_names import MAKERS, PRIMITIVE_LIKE, declared_name, function_declarator, strip_templates, unwrap_type
from .dead_code import after_exit

if TYPE_CHECKING:
    from .cpp import CppExtractor

ARGLIST_CAP = 400

def strip_this(a: str) -> str:
    a = a.replace(" ", "")
    return a[6:] if a.startswith("this->") else a


def classify_options(options: str | None, inherit: bool) -> str | None:
    """Device of an ATen factory from its TensorOptions argument text:
    ``cuda``, ``pinned``, ``unknown``, or None for a host (CPU) tensor."""
    if options is None:
        return "unknown" if inherit else None
    o = options.replace(" ", "")
    if "pinned_memory(true)" in o:
        return "pinned"
    if re.search(r"kCUDA|DeviceType::CUDA|\"cuda|\.cuda\(\)|device\(at::kCUDA|Device\(c10::kCUDA", o):
        return "cuda"
    if re.search(r"kCPU|DeviceType::CPU|\"cpu", o):
        return None
    if re.fullmatch(r"(?:at|torch|c10)::(?:k[A-Z]\w*|ScalarType::\w+)", o) or (
        re.fullmatch(r"(?:at|torch)::dtype\(.*\)", o) and ".device(" not in o
    ) or _fresh_without_device(o):
        return None  # only a dtype: a CPU tensor
    return "unknown"


# options built from scratch (not `x.options()`, which follows x): a constructor
# given nothing or a dtype constant, then setters that never name a device
_FRESH = re.compile(r"(?:at|torch|c10)::(?:TensorOptions\((?:(?:at|torch|c10)::(?:k[A-Z]\w*|ScalarType::\w+))?\)|"
                    r"(?:dtype|requires_grad|layout)(?:<[\w:]+>)?\([^()]*\))")
_SETTER = re.compile(r"\.(?:dtype|requires_grad|layout|memory_format)(?:<[\w:]+>)?\([^()]*(?:\([^()]*\)[^()]*)*\)")


def _fresh_without_device(options: str) -> bool:
    """`c10::TensorOptions().dtype(t)`, `torch::dtype(t).requires_grad(false)`:
    no device anywhere in the chain, so the factory makes a CPU tensor."""
    head = _FRESH.match(options)
    if head is None:
        return False
    at = head.end()
    while at < len(options):
        setter = _SETTER.match(options, at)
        if setter is None:
            return False
        at = setter.end()
    return True


def _declarator_parts(src: Source, node: Any) -> tuple[str, str, tuple[Arg, ...] | None]:
    """(declared name, initialiser text, constructor args or None)."""
    if node.type == "init_declarator":
        name = declared_name(src, node.child_by_field_name("declarator"))
        value = node.child_by_field_name("value")
        if value is None:
            return name, "", None
        if value.type in ("argument_list", "initializer_list"):
            return name, src.text(value), _args(src, value)
        return name, src.text(value), None
    if node.type == "function_declarator":  # `T v(n);` read as a declaration of a function
        inner = node.child_by_field_name("declarator")
        params = node.child_by_field_name("parameters")
        if inner is not None and inner.type == "identifier" and params is not None:
            args = tuple(Arg(None, src.text(p)) for p in params.named_children)
            return src.raw(inner), src.text(params), args
        return "", "", None
    return declared_name(src, node), "", None


def _args(src: Source, node: Any) -> tuple[Arg, ...]:
    return tuple(Arg(None, src.text(c)) for c in node.named_children if c.type != "comment")


def _template_argument(src: Source, fn: Any) -> str:
    args = fn.child_by_field_name("arguments")
    if args is None:
        name = fn.child_by_field_name("name")
        args = name.child_by_field_name("arguments") if name is not None else None
    if args is None or not args.named_child_count:
        return ""
    return strip_templates(src.raw(args.named_children[0]))


def _target_of(src: Source, node: Any) -> str | None:
    parent = node.parent
    child = node
    while parent is not None and parent.type in ("parenthesized_expression", "cast_expression", "pointer_expression"):
        child, parent = parent, parent.parent
    if parent is None:
        return None
    if parent.type == "init_declarator" and parent.child_by_field_name("value") == child:
        return declared_name(src, parent.child_by_field_name("declarator")) or None
    if parent.type == "assignment_expression" and parent.child_by_field_name("right") == child:
        left = parent.child_by_field_name("left")
        return strip_this(src.text(left)) if left is not None else None
    return None


def unwrapped(node: Any) -> Any:
    """The expression inside casts and parentheses (`(void*)x`, `(x)`)."""
    for _ in range(4):
        if node.type == "parenthesized_expression" and node.named_child_count:
            node = node.named_children[0]
        elif node.type == "cast_expression":
            value = node.child_by_field_name("value")
            if value is None:
                break
            node = value
        else:
            break
    return node


def callee_of(ext: CppExtractor, fn: Any) -> tuple[str, str]:
    """(qualified callee text, method/last name)."""
    t = fn.type
    if t == "field_expression":
        field = fn.child_by_field_name("field")
        arg = fn.child_by_field_name("argument")
        op = "->" if b"->" in fn.text[: (field.start_byte - fn.start_byte) if field is not None else None] else "."
        receiver = strip_this(ext.src.text(arg, 80)) if arg is not None else "?"
        if receiver.startswith("this->"):
            receiver = receiver[6:]
        name = strip_templates(ext.src.raw(field)) if field is not None else "?"
        if receiver == "this":
            return name, name
        return f"{receiver}{op}{name}", name
    if t in ("identifier", "qualified_identifier", "template_function", "field_identifier", "type_identifier",
             "template_type"):
        name = strip_templates(ext.src.raw(fn))
        return name, name.rsplit("::", 1)[-1]
    shown = ext.src.text(fn, 80)
    return shown, shown


def arglist_of(ext: CppExtractor, args_node: Any | None) -> str:
    if args_node is None or args_node.end_byte - args_node.start_byte <= 2:
        return ""
    text = ext.src.text(args_node, ARGLIST_CAP)
    return text[1:-1].strip() if text[:1] in "({" and text[-1:] in ")}" else text


def calls(ext: CppExtractor, nodes: list[Any], calls: list[Call], sites: list[Site]) -> None:
    apis = ext.apis
    for node in nodes:
        fn = node.child_by_field_name("function")
        if fn is None:
            continue
        callee, leaf = callee_of(ext, fn)
        args_node = node.child_by_field_name("arguments")
        scope = ext.scope_for(node)
        span = ext.src.span(node)
        target = ext.rhs_targets.get(node.start_byte)
        arglist = arglist_of(ext, args_node)
        if callee in MAKERS or callee.endswith(("::make_unique", "::make_shared")):
            made = _template_argument(ext.src, fn)
            if made:
                calls.append(Call(scope, span, made, arglist, target))
                spec = apis.cpp_types.get(made)
                if spec is not None:
                    add_site(ext, sites, node, spec, scope, span, _args(ext.src, args_node), target)
                continue
        calls.append(Call(scope, span, callee, arglist, target))
        spec = None
        if fn.type == "field_expression":
            spec = apis.cpp_methods.get(leaf)
        else:
            spec = apis.cpp_lookup(callee)
            if spec is None and fn.type in ("template_function", "qualified_identifier", "identifier"):
                raw = ext.src.raw(fn).replace(" ", "")
                spec = apis.cpp_types.get(strip_templates(raw)) if "<" in raw else None
        if spec is not None and args_node is not None:
            add_site(ext, sites, node, spec, scope, span, _args(ext.src, args_node), target)


def news(ext: CppExtractor, nodes: list[Any], calls: list[Call], sites: list[Site]) -> None:
    for node in nodes:
        type_node = node.child_by_field_name("type")
        if type_node is None:
            continue
        name = strip_templates(ext.src.raw(type_node))
        args_node = node.child_by_field_name("arguments")
        scope = ext.scope_for(node)
        span = ext.src.span(node)
        target = ext.rhs_targets.get(node.start_byte)
        calls.append(Call(scope, span, name, arglist_of(ext, args_node), target))
        spec = ext.apis.cpp_types.get(name)
        if spec is not None:
            args = _args(ext.src, args_node) if args_node is not None else ()
            add_site(ext, sites, node, spec, scope, span, args, target)


def declarations(ext: CppExtractor, nodes: list[Any], calls: list[Call], sites: list[Site],
                 assigns: list[Assign]) -> None:
    for node in nodes:
        type_node = node.child_by_field_name("type")
        if type_node is None:
            continue
        type_text = ext.src.raw(type_node)
        type_name = strip_templates(type_text)
        spec = ext.apis.cpp_types.get(type_name)
        scope = ext.scope_for(node)
        static = any(c.type == "storage_class_specifier" and ext.src.raw(c) in ("static", "thread_local")
                     for c in node.children)  # a `thread_local` is kept across the thread's calls
        class_like = type_node.type in ("type_identifier", "qualified_identifier", "template_type") and not \
            PRIMITIVE_LIKE.match(type_text)
        for declarator in node.children_by_field_name("declarator"):
            name, value, args = _declarator_parts(ext.src, declarator)
            if not name:
                continue
            if declarator.type == "init_declarator":
                value_node = declarator.child_by_field_name("value")
                if value_node is not None:
                    ext.rhs_targets[unwrapped(value_node).start_byte] = name
            line = declarator.start_point[0] + 1
            targets = tuple(n.strip() for n in name.split(",")) if declarator.type == "structured_binding_declarator" \
                else (name,)
            declared = unwrap_type(type_text)
            if _is_reference(declarator):
                declared += "&"  # a reference aliases what it is bound to (a member's element...)
            assigns.append(Assign(scope, line, targets, value, "=", f"static {declared}" if static else declared))
            constructs = args is not None or (value == "" and declarator.type in ("identifier",))
            if class_like and constructs and type_node.type != "primitive_type":
                span = ext.src.span(declarator)
                arglist = ", ".join(a.text for a in args) if args else ""
                calls.append(Call(scope, span, type_name, arglist, name))
                if spec is not None:
                    add_site(ext, sites, declarator, spec, scope, span, args or (), name)


def add_site(ext: CppExtractor, sites: list[Site], node: Any, spec: ApiSpec, scope: str, span: Any,
              args: tuple[Arg, ...], target: str | None) -> None:
    if after_exit(ext.dead, node):
        return  # after an unconditional return/throw in its block: never runs
    kind = spec.kind
    device: str | None = None
    if spec.device in ("options", "inherit"):
        # the options come last (`torch::randint(lo, hi, {n}, torch::dtype(t))`, `at::full(size, v, opts)`)
        options = args[-1].text if len(args) > 1 else None
        if options is not None and b"TensorOptions" in ext.src.data:
            options = local_options(ext, node, options)
        found = classify_options(options, spec.device == "inherit")
        if found == "unknown" and options is None and args and host_local(ext, node, args[0].text):
            return  # `empty_like(ids)` of `auto ids = torch::empty({n}, torch::kLong);`: a CPU tensor
        if found == "unknown" and _host_source(ext, node, options, args, target):
            return  # `at::zeros(n, x.options())` where the function checks `x` is on the CPU (cpp_host.py)
        if found == "unknown" and options is not None and _host_variable(ext, node, options):
            return  # `torch::empty(n, dtype)` of a `torch::ScalarType dtype`; a device local bound to kCPU
        if found is None:
            return
        if found == "pinned":
            kind, device = SiteKind.PINNED_HOST, "cpu"
        else:
            device = found
    elif spec.device == "cuda":
        device = "cuda"
    size_parts = tuple(args[i].text for i in spec.size if i < len(args))
    if zero_elements(spec.api, size_parts):
        return  # `at::empty({0}, ...)`: no elements, no memory
    if spec.target.startswith("arg:"):
        index = int(spec.target[4:])
        if index < len(args):
            target = pointer_target(args[index].text)
            if kind is SiteKind.RELEASE:
                if _NULL_POINTER.fullmatch(args[index].text):
                    return  # `cudaFree(0)`, `cudaFree(nullptr)`: frees nothing (the idiom that sets up the context)
                target = target.lstrip("*")
    sites.append(ext.at.site(node, spec.api, kind, scope, span, ", ".join(size_parts) if size_parts else None,
                              size_parts, device, target, wrapper(ext, node)))


# a null pointer literal, cast or not (`0`, `nullptr`, `NULL`, `(void *)0`): a release of it frees nothing
_NULL_POINTER = re.compile(r"\s*(?:\(\s*[\w:\s]+\**\s*\)\s*)?(?:0|nullptr|NULL)\s*")


def _host_source(ext: CppExtractor, node: Any, options: str | None, args: tuple[Arg, ...],
                 target: str | None) -> bool:
    """The factory's tensor follows an input of a function registered only
    for the CPU key, or one its function proves is on the host, or is itself
    read through a host accessor (``cpp_host.py``)."""
    fn = common.enclosing(node.parent, "function_definition")
    block = fn.child_by_field_name("body") if fn is not None else None
    if fn is None or block is None:
        return False
    source = cpp_host.source_tensor(options, [a.text for a in args])
    if source is None and options is not None:
        local = _OPTIONS_LOCAL.fullmatch(options.strip())
        if local is not None:
            before = ext.src.data[fn.start_byte:node.start_byte].decode("utf-8", "replace")
            bound = cpp_host.bound_options(before, local.group(1))
            source = cpp_host.source_tensor(bound, []) if bound is not None else None
    if source is not None and _function_name(ext, fn) in ext.host_functions():
        return True
    if cpp_host.names_device(ext.src.data[fn.start_byte:fn.end_byte].decode("utf-8", "replace")):
        return False  # a function that also names CUDA proves nothing by its host reads
    # the proof is a statement every run of the function reaches: one directly in its body
    body = "\n".join(ext.src.data[c.start_byte:c.end_byte].decode("utf-8", "replace") for c in block.named_children
                     if c.type in ("expression_statement", "declaration"))
    if target is not None and cpp_host.proven_host(body, target):
        return True
    return source is not None and cpp_host.proven_host(body, source)


def _host_variable(ext: CppExtractor, node: Any, options: str) -> bool:
    """The options are variables that name no device or the CPU (``cpp_host_options.py``)."""
    value = cpp_host_options.expanded(ext, node, options)
    return value is not None and classify_options(value, False) is None


def _function_name(ext: CppExtractor, fn: Any) -> str:
    declarator = function_declarator(fn.child_by_field_name("declarator"))
    inner = declarator.child_by_field_name("declarator") if declarator is not None else None
    return strip_templates(ext.src.raw(inner)).rsplit("::", 1)[-1] if inner is not None else ""


_OPTIONS_LOCAL = re.compile(r"([A-Za-z_]\w*)((?:\.\w+\([^()]*\))*)")
# `const auto options = at::TensorOptions(...)...;` (also `TensorOptions options = ...;`)
_OPTIONS_BINDING = re.compile(r"(?:[\w:<>]+\s+)+&?\s*([A-Za-z_]\w*)\s*=\s*((?:at|torch|c10)::[^;]*);")
_ASSIGNED = re.compile(r"(?<![\w.>])([A-Za-z_]\w*)\s*=(?!=)")


def matches_above(ext: CppExtractor, body: Any, node: Any, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    """``pattern.finditer`` over the text of the function ``body`` before ``node``, each site asking of its
    function's text up to itself. One pass per function and pattern: the matches in the whole function that
    end by ``node`` are those of the text cut there, for the patterns here (each match ends at a fixed
    delimiter, ``;``, ``);`` or ``=``, that every way of matching from its start reaches; a start whose match
    runs past the cut matches nothing before it; tests/test_cpp_matches_above.py). The text must be ASCII
    (byte and character offsets agree) and the byte at the cut no ``=`` (``_ASSIGNED``'s ``(?!=)`` reads it):
    else the cut text is searched itself."""
    key = (body.start_byte, pattern.pattern)
    if key in ext.body_matches:
        held = ext.body_matches[key]
    else:
        raw = ext.src.data[body.start_byte:body.end_byte]
        held = ext.body_matches[key] = (raw.decode("ascii"), list(pattern.finditer(raw.decode("ascii")))) \
            if raw.isascii() else None
    cut = node.start_byte - body.start_byte
    if held is None or held[0][cut:cut + 1] == "=":
        return list(pattern.finditer(ext.src.data[body.start_byte:node.start_byte].decode("utf-8", "replace")))
    return [m for m in held[1] if m.end() <= cut]


def local_options(ext: CppExtractor, node: Any, text: str) -> str:
    """``text`` with a local options variable (`options`, `options.dtype(at::kInt)`)
    replaced by what the function bound it to, when its only binding above
    the call builds options from scratch; else ``text`` unchanged."""
    m = _OPTIONS_LOCAL.fullmatch(text.strip())
    if m is None:
        return text
    body = common.enclosing(node.parent, "function_definition")
    if body is None:
        return text
    bindings, assigned = matches_above(ext, body, node, _OPTIONS_BINDING), matches_above(ext, body, node, _ASSIGNED)
    values = [b.group(2) for b in bindings if b.group(1) == m.group(1)]
    if len(values) != 1 or sum(a.group(1) == m.group(1) for a in assigned) != 1:
        return text  # bound twice, or assigned again: not one known value
    return " ".join(values[0].split()) + m.group(2)


# `torch::Tensor ids = torch::empty({n}, torch::kLong);`: a local made by a factory
_FACTORY_BINDING = re.compile(r"(?:[\w:<>]+\s+)+&?\s*([A-Za-z_]\w*)\s*=\s*(?:at|torch)::"
                              r"(?:empty|zeros|ones|full|rand|randn|randint|arange|tensor)\s*\((.*?)\);", re.S)


def host_local(ext: CppExtractor, node: Any, text: str) -> bool:
    """``text`` names a local of the function whose one binding above the call
    is a factory whose options (a dtype, none, `kCPU`) make a CPU tensor."""
    name = text.strip()
    if not name.isidentifier() or b"::" not in ext.src.data:
        return False
    body = common.enclosing(node.parent, "function_definition")
    if body is None:
        return False
    if name not in ext.src.data[body.start_byte:node.start_byte].decode("utf-8", "replace"):
        return False
    found = [b.group(2) for b in matches_above(ext, body, node, _FACTORY_BINDING) if b.group(1) == name]
    if len(found) != 1 or sum(a.group(1) == name for a in matches_above(ext, body, node, _ASSIGNED)) != 1:
        return False
    args = split_top_level(found[0])
    return len(args) <= 2 and classify_options(args[1].strip() if len(args) == 2 else None, False) is None


def wrapper(ext: CppExtractor, node: Any) -> str | None:
    fn = common.wrapping_call(node, "call_expression", parent_of=ext.up.parent)
    return callee_of(ext, fn)[0] if fn is not None else None


def mark_exports(ext: CppExtractor, sites: list[Site], calls: list[Call]) -> list[Site]:
    exports = ext.apis.cpp_exports
    if not exports or not sites:
        return sites
    exported: dict[str, set[str]] = {}
    for call in calls:
        if call.callee.rsplit("::", 1)[-1] in exports:
            exported.setdefault(call.scope, set()).update(
                {strip_this(w) for w in re.findall(r"[A-Za-z_][\w.>-]*", call.arglist)}
            )
    return common.mark_exported(sites, exported, lambda target: target.lstrip("*"))


def _is_reference(declarator: Any) -> bool:
    """Whether a declarator declares a reference (`T& x = ...`, `T*& p = ...`)."""
    node = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else declarator
    while node is not None:
        if node.type == "reference_declarator":
            return True
        if node.type != "pointer_declarator":
            return False
        node = node.child_by_field_name("declarator")
    return False


def mark_static(sites: list[Site], assigns: list[Assign]) -> list[Site]:
    """A site whose memory goes to a function-local `static` is made once per
    process, however often the function runs (``Site.kept`` = ``static``);
    so is one in a lambda of that function (`std::call_once(flag, [&] {
    cudaMallocHost(&buf, n); })`: the lambda captures the static), and one
    into a file-scope variable the function does not declare itself nor
    release (`if (!pool) cudaMallocHost(&pool, n);`)."""
    statics = {(a.scope, t) for a in assigns if a.type and (a.type.startswith("static ") or a.scope == _FILE)
               for t in a.targets}
    if not statics:
        return sites
    local = {(a.scope, t) for a in assigns if a.type and a.scope != _FILE for t in a.targets}  # declared there
    freed = {(s.scope, s.target) for s in sites if s.kind is SiteKind.RELEASE and s.target}
    return [dataclasses.replace(s, kept="static") if s.target and _static(s.scope, s.target, statics, local, freed)
            else s for s in sites]


_FILE = "<module>"


def _static(scope: str, target: str, statics: set[tuple[str, str]], local: set[tuple[str, str]],
            freed: set[tuple[str, str]]) -> bool:
    outer = scope
    while outer.endswith("::<lambda>"):
        outer = outer.removesuffix("::<lambda>")
    if (outer, target) in statics:
        return True
    return (_FILE, target) in statics and (outer, target) not in local and (scope, target) not in local \
        and (scope, target) not in freed and (outer, target) not in freed
