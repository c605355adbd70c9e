"""Stage 3, extract (C++ and CUDA): tree-sitter tree -> FileFacts.

Both grammars share node names, so one extractor serves both. As for Python,
one query captures the nodes of interest and a sweep over scope ranges gives
each its enclosing qualified scope (``ns::Class::method``, ``f::<lambda>``).

Constructions are recorded as calls to the class name, however they are
written (``Foo(...)``, ``new Foo(...)``, ``std::make_unique<Foo>(...)``,
``Foo foo(...)``), so the index can follow them to constructors. Macro
bodies (``#define``) are not code to tree-sitter and produce nothing.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import tree_sitter as ts

from ...catalog import ApiCatalog, ApiSpec
from ...model import (
    Arg,
    Assign,
    Block,
    Call,
    CallTable,
    Field,
    FileFacts,
    Language,
    Return,
    Scope,
    Site,
    SiteKind,
)
from ..parse import language
from . import common
from .common import Containers, Source

_QUERY_TEXT = """
(function_definition) @def
(class_specifier body: (_)) @class
(struct_specifier body: (_)) @class
(namespace_definition) @ns
(lambda_expression) @lambda
(call_expression) @call
(new_expression) @new
(declaration) @decl
(field_declaration) @field
(assignment_expression) @assign
(return_statement) @return
(if_statement) @if
(for_statement) @loop
(for_range_loop) @loop
(while_statement) @loop
(do_statement) @loop
(try_statement) @try
(catch_clause) @catch
"""

ARGLIST_CAP = 400
_FLOW_ENDS = {"return_statement", "throw_statement", "break_statement", "continue_statement", "goto_statement"}
_STATEMENT_PARENTS = {"compound_statement", "translation_unit", "declaration_list", "field_declaration_list"}
_SMART = re.compile(r"^(?:std::)?(?:unique_ptr|shared_ptr|weak_ptr|optional|reference_wrapper)<(.*)>$")
_MAKERS = {"std::make_unique", "std::make_shared", "make_unique", "make_shared"}
_PRIMITIVE_LIKE = re.compile(r"^(?:const\s+)?(?:unsigned|signed|int|long|short|char|bool|float|double|void|auto|size_t|u?int\d+_t)\b")


@lru_cache(maxsize=None)
def _query(grammar: Language) -> ts.Query:
    return ts.Query(language(grammar), _QUERY_TEXT)


def strip_templates(name: str) -> str:
    """``a::B<T, C<D>>::f<int>`` -> ``a::B::f``; whitespace removed."""
    if "<" not in name and " " not in name and "\n" not in name:
        return name[2:] if name.startswith("::") else name
    out: list[str] = []
    depth = 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0 and not ch.isspace():
            out.append(ch)
    result = "".join(out)
    return result[2:] if result.startswith("::") else result


def unwrap_type(type_text: str) -> str:
    """The class a declared type refers to: smart pointers, const, pointers
    and references unwrapped, template arguments dropped."""
    t = " ".join(type_text.split())
    t = re.sub(r"^(?:const|volatile|static|mutable|inline|constexpr)\s+", "", t)
    t = t.rstrip("*& ").replace(" ", "")
    for _ in range(3):
        m = _SMART.match(t)
        if not m:
            break
        t = m.group(1)
    return strip_templates(t).rstrip("*&")


def _strip_address(arg: str) -> str:
    """`(void**)&p`, `reinterpret_cast<void**>(&this->p)`, `&p` -> `p`; a
    plain pointer-to-pointer parameter `pp` -> `*pp`."""
    a = arg.strip()
    for _ in range(4):
        m = re.fullmatch(r"\(\s*[\w:<>\s\*&]+\)\s*(.*)", a, re.S) or re.fullmatch(
            r"(?:reinterpret_cast|static_cast|const_cast)\s*<[^>]*>\s*\((.*)\)", a, re.S
        )
        if m is None:
            break
        a = m.group(1).strip()
    if a.startswith("(") and a.endswith(")"):
        a = a[1:-1].strip()
    if a.startswith("&"):
        a = a[1:].strip()
        if a.startswith("(") and a.endswith(")"):
            a = a[1:-1].strip()
        return _strip_this(a)
    return "*" + _strip_this(a)


def _strip_this(a: str) -> str:
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
    ):
        return None  # only a dtype: a CPU tensor
    return "unknown"


class _Extractor:
    def __init__(self, path: str, lang: Language, source: bytes, tree: Any, apis: ApiCatalog) -> None:
        self.path = path
        self.lang = lang
        self.src = Source(source)
        self.tree = tree
        self.apis = apis
        self.at = common.SiteAt(path, lang, _STATEMENT_PARENTS, tree.root_node.has_error)

    def run(self, grammar: Language) -> FileFacts:
        caps = common.ordered_captures(_query(grammar), self.tree.root_node)
        get = caps.get
        self._containers(get("def", ()), get("class", ()), get("ns", ()), get("lambda", ()))
        calls: list[Call] = []
        sites: list[Site] = []
        assigns: list[Assign] = []
        # declarations and assignments first: they record which calls are a
        # whole right-hand side (asking a node for its parent walks the tree)
        self.rhs_targets: dict[int, str] = {}
        self._declarations(get("decl", ()), calls, sites, assigns)
        self._assignments(get("assign", ()), assigns)
        self._calls(get("call", ()), calls, sites)
        self._news(get("new", ()), calls, sites)
        sites.sort(key=lambda s: (s.span.line, s.span.col))
        assigns.sort(key=lambda a: a.line)
        return FileFacts(
            path=self.path,
            language=self.lang,
            digest="",
            sites=tuple(self._mark_exports(sites, calls)),
            scopes=tuple(self._scope_facts()),
            calls=CallTable.of(calls),
            assigns=tuple(assigns),
            returns=tuple(self._returns(get("return", ()))),
            blocks=tuple(self._blocks(caps)),
            fields=tuple(self._fields(get("field", ()))),
            annotations=tuple(common.annotations(self.src, common.comment_nodes(self.tree.root_node, self.src.data), (b"//", b"/*", b"*"))),
            lines_of_code=self.src.data.count(b"\n") + (0 if self.src.data.endswith(b"\n") or not self.src.data else 1),
        )

    # ------------------------------------------------------------ scopes
    def _containers(self, defs: list[Any], classes: list[Any], namespaces: list[Any], lambdas: list[Any]) -> None:
        entries: list[tuple[Any, str, Any, str]] = []  # node, kind, body, name
        for node in defs:
            body = node.child_by_field_name("body")
            declarator = _function_declarator(node.child_by_field_name("declarator"))
            if body is None or declarator is None:
                continue
            inner = declarator.child_by_field_name("declarator")
            name = strip_templates(self.src.raw(inner)) if inner is not None else "?"
            entries.append((node, "function", body, name))
        for node in classes:
            body = node.child_by_field_name("body")
            name_node = node.child_by_field_name("name")
            name = strip_templates(self.src.raw(name_node)) if name_node is not None else "(anonymous)"
            entries.append((node, "class", body, name))
        for node in namespaces:
            body = node.child_by_field_name("body")
            name_node = node.child_by_field_name("name")
            name = self.src.raw(name_node).replace(" ", "") if name_node is not None else "(anonymous)"
            if body is not None:
                entries.append((node, "namespace", body, name))
        for node in lambdas:
            body = node.child_by_field_name("body")
            if body is not None:
                entries.append((node, "lambda", body, "<lambda>"))
        self.entries = entries
        self.containers = Containers([(body.start_byte, node.end_byte) for node, _, body, _ in entries])
        n = len(entries)
        self.qualnames = [""] * n
        order = sorted(range(n), key=lambda i: entries[i][2].start_byte)
        for i in order:
            parent = self.containers.parent[i]
            name = entries[i][3]
            self.qualnames[i] = f"{self.qualnames[parent]}::{name}" if parent >= 0 else name

    def scope_index(self, node: Any) -> int:
        return self.containers.innermost(node.start_byte)

    def scope_name(self, index: int) -> str:
        return self.qualnames[index] if index >= 0 else "<module>"

    def _kind(self, index: int) -> str:
        return self.entries[index][1] if index >= 0 else "module"

    def _owner(self, index: int) -> str | None:
        kind = self._kind(index)
        parent = self.containers.parent[index]
        if kind == "function":
            if parent >= 0 and self._kind(parent) == "class":
                return self.qualnames[parent]
            qual = self.qualnames[index]
            name = self.entries[index][3]
            if "::" in name:  # out-of-line definition `Foo::bar`
                return qual.rsplit("::", 1)[0]
            return None
        while parent >= 0:
            if self._kind(parent) == "class":
                return self.qualnames[parent]
            parent = self.containers.parent[parent]
        return None

    def _role(self, index: int, owner: str | None) -> str:
        kind = self._kind(index)
        if kind in ("class", "lambda"):
            return kind
        short = self.entries[index][3].rsplit("::", 1)[-1]
        if short.startswith("~"):
            return "destructor"
        if owner is not None:
            return "constructor" if short == owner.rsplit("::", 1)[-1] else "method"
        return "function"

    def _scope_facts(self) -> list[Scope]:
        out = []
        for i, (node, kind, body, name) in enumerate(self.entries):
            if kind == "namespace":
                continue
            owner = self._owner(i)
            params: list[str] = []
            types: list[str] = []
            bases: list[str] = []
            if kind in ("function", "lambda"):
                if kind == "function":
                    declarator = _function_declarator(node.child_by_field_name("declarator"))
                    plist = declarator.child_by_field_name("parameters") if declarator is not None else None
                else:
                    lam = node.child_by_field_name("declarator")
                    plist = lam.child_by_field_name("parameters") if lam is not None else None
                for p in plist.named_children if plist is not None else ():
                    if p.type in ("parameter_declaration", "optional_parameter_declaration"):
                        pname = _declared_name(self.src, p.child_by_field_name("declarator"))
                        ptype = p.child_by_field_name("type")
                        params.append(pname or "")
                        types.append(unwrap_type(self.src.raw(ptype)) if ptype is not None else "")
            else:
                for child in node.named_children:
                    if child.type == "base_class_clause":
                        bases += [strip_templates(self.src.raw(b)) for b in child.named_children
                                  if b.type in ("type_identifier", "qualified_identifier", "template_type")]
            short = name.rsplit("::", 1)[-1]
            out.append(
                Scope(
                    qualname=self.qualnames[i],
                    name=short,
                    kind=kind,
                    role=self._role(i, owner),
                    span=self.src.span(node),
                    owner=owner,
                    params=tuple(params),
                    param_types=tuple(types),
                    bases=tuple(bases),
                )
            )
        return out

    def _scope_for(self, node: Any) -> str:
        """Qualified scope; code directly in a namespace or at file level is
        `<module>` (a namespace-qualified name when inside one)."""
        index = self.scope_index(node)
        if index >= 0 and self._kind(index) == "namespace":
            return self.qualnames[index]
        return self.scope_name(index)

    # ------------------------------------------------------------ calls and sites
    def _callee(self, fn: Any) -> tuple[str, str]:
        """(qualified callee text, method/last name)."""
        t = fn.type
        if t == "field_expression":
            field = fn.child_by_field_name("field")
            arg = fn.child_by_field_name("argument")
            op = "->" if b"->" in fn.text[: (field.start_byte - fn.start_byte) if field is not None else None] else "."
            receiver = _strip_this(self.src.text(arg, 80)) if arg is not None else "?"
            if receiver.startswith("this->"):
                receiver = receiver[6:]
            name = strip_templates(self.src.raw(field)) if field is not None else "?"
            if receiver == "this":
                return name, name
            return f"{receiver}{op}{name}", name
        if t in ("identifier", "qualified_identifier", "template_function", "field_identifier", "type_identifier",
                 "template_type"):
            name = strip_templates(self.src.raw(fn))
            return name, name.rsplit("::", 1)[-1]
        shown = self.src.text(fn, 80)
        return shown, shown

    def _arglist(self, args_node: Any | None) -> str:
        if args_node is None or args_node.end_byte - args_node.start_byte <= 2:
            return ""
        text = self.src.text(args_node, ARGLIST_CAP)
        return text[1:-1].strip() if text[:1] in "({" and text[-1:] in ")}" else text

    def _calls(self, nodes: list[Any], calls: list[Call], sites: list[Site]) -> None:
        apis = self.apis
        for node in nodes:
            fn = node.child_by_field_name("function")
            if fn is None:
                continue
            callee, leaf = self._callee(fn)
            args_node = node.child_by_field_name("arguments")
            scope = self._scope_for(node)
            span = self.src.span(node)
            target = self.rhs_targets.get(node.start_byte)
            arglist = self._arglist(args_node)
            if callee in _MAKERS or callee.endswith(("::make_unique", "::make_shared")):
                made = _template_argument(self.src, fn)
                if made:
                    calls.append(Call(scope, span, made, arglist, target))
                    spec = apis.cpp_types.get(made)
                    if spec is not None:
                        self._add_site(sites, node, spec, scope, span, _args(self.src, args_node), target)
                    continue
            calls.append(Call(scope, span, callee, arglist, target))
            spec = None
            if fn.type == "field_expression":
                spec = apis.cpp_methods.get(leaf)
            else:
                spec = apis.cpp_lookup(callee)
                if spec is None and fn.type in ("template_function", "qualified_identifier", "identifier"):
                    raw = self.src.raw(fn).replace(" ", "")
                    spec = apis.cpp_types.get(strip_templates(raw)) if "<" in raw else None
            if spec is not None and args_node is not None:
                self._add_site(sites, node, spec, scope, span, _args(self.src, args_node), target)

    def _news(self, nodes: list[Any], calls: list[Call], sites: list[Site]) -> None:
        for node in nodes:
            type_node = node.child_by_field_name("type")
            if type_node is None:
                continue
            name = strip_templates(self.src.raw(type_node))
            args_node = node.child_by_field_name("arguments")
            scope = self._scope_for(node)
            span = self.src.span(node)
            target = self.rhs_targets.get(node.start_byte)
            calls.append(Call(scope, span, name, self._arglist(args_node), target))
            spec = self.apis.cpp_types.get(name)
            if spec is not None:
                args = _args(self.src, args_node) if args_node is not None else ()
                self._add_site(sites, node, spec, scope, span, args, target)

    def _declarations(self, nodes: list[Any], calls: list[Call], sites: list[Site], assigns: list[Assign]) -> None:
        for node in nodes:
            type_node = node.child_by_field_name("type")
            if type_node is None:
                continue
            type_text = self.src.raw(type_node)
            type_name = strip_templates(type_text)
            spec = self.apis.cpp_types.get(type_name)
            scope = self._scope_for(node)
            static = any(c.type == "storage_class_specifier" and self.src.raw(c) == "static" for c in node.children)
            class_like = type_node.type in ("type_identifier", "qualified_identifier", "template_type") and not \
                _PRIMITIVE_LIKE.match(type_text)
            for declarator in node.children_by_field_name("declarator"):
                name, value, args = _declarator_parts(self.src, declarator)
                if not name:
                    continue
                if declarator.type == "init_declarator":
                    value_node = declarator.child_by_field_name("value")
                    if value_node is not None:
                        self.rhs_targets[_unwrapped(value_node).start_byte] = name
                line = declarator.start_point[0] + 1
                targets = tuple(n.strip() for n in name.split(",")) if declarator.type == "structured_binding_declarator" \
                    else (name,)
                declared = unwrap_type(type_text)
                assigns.append(Assign(scope, line, targets, value, "=", f"static {declared}" if static else declared))
                constructs = args is not None or (value == "" and declarator.type in ("identifier",))
                if class_like and constructs and type_node.type != "primitive_type":
                    span = self.src.span(declarator)
                    arglist = ", ".join(a.text for a in args) if args else ""
                    calls.append(Call(scope, span, type_name, arglist, name))
                    if spec is not None:
                        self._add_site(sites, declarator, spec, scope, span, args or (), name)

    def _add_site(self, sites: list[Site], node: Any, spec: ApiSpec, scope: str, span: Any,
                  args: tuple[Arg, ...], target: str | None) -> None:
        kind = spec.kind
        device: str | None = None
        if spec.device in ("options", "inherit"):
            options = args[1].text if len(args) > 1 else None
            found = classify_options(options, spec.device == "inherit")
            if found is None:
                return
            if found == "pinned":
                kind, device = SiteKind.PINNED_HOST, "cpu"
            else:
                device = found
        elif spec.device == "cuda":
            device = "cuda"
        size_parts = tuple(args[i].text for i in spec.size if i < len(args))
        if spec.target.startswith("arg:"):
            index = int(spec.target[4:])
            if index < len(args):
                target = _strip_address(args[index].text)
                if kind is SiteKind.RELEASE:
                    target = target.lstrip("*")
        sites.append(self.at.site(node, spec.api, kind, scope, span, ", ".join(size_parts) if size_parts else None,
                                  size_parts, device, target, self._wrapper(node)))

    def _wrapper(self, node: Any) -> str | None:
        fn = common.wrapping_call(node, "call_expression")
        return self._callee(fn)[0] if fn is not None else None

    def _mark_exports(self, sites: list[Site], calls: list[Call]) -> list[Site]:
        exports = self.apis.cpp_exports
        if not exports or not sites:
            return sites
        exported: dict[str, set[str]] = {}
        for call in calls:
            if call.callee.rsplit("::", 1)[-1] in exports:
                exported.setdefault(call.scope, set()).update(
                    {_strip_this(w) for w in re.findall(r"[A-Za-z_][\w.>-]*", call.arglist)}
                )
        return common.mark_exported(sites, exported, lambda target: target.lstrip("*"))

    # ------------------------------------------------------------ other facts
    def _assignments(self, nodes: list[Any], assigns: list[Assign]) -> None:
        for node in nodes:
            left, right, op = (node.child_by_field_name(f) for f in ("left", "right", "operator"))
            if left is None:
                continue
            if right is not None:
                self.rhs_targets[_unwrapped(right).start_byte] = _strip_this(self.src.text(left))
            assigns.append(
                Assign(
                    self._scope_for(node),
                    node.start_point[0] + 1,
                    (_strip_this(self.src.text(left)),),
                    self.src.text(right) if right is not None else "",
                    self.src.raw(op) if op is not None else "=",
                )
            )

    def _returns(self, nodes: list[Any]) -> list[Return]:
        out = []
        for node in nodes:
            value = next((c for c in node.named_children if c.type != "comment"), None)
            out.append(Return(self._scope_for(node), node.start_point[0] + 1, self.src.text(value) if value is not None else ""))
        return out

    def _fields(self, nodes: list[Any]) -> list[Field]:
        out = []
        for node in nodes:
            parent = node.parent
            if parent is None or parent.type != "field_declaration_list":
                continue
            type_node = node.child_by_field_name("type")
            owner_index = self.scope_index(node)
            if type_node is None or owner_index < 0 or self._kind(owner_index) != "class":
                continue
            for declarator in node.children_by_field_name("declarator"):
                if declarator.type == "function_declarator":
                    continue
                name = _declared_name(self.src, declarator)
                if name:
                    out.append(Field(self.qualnames[owner_index], name, unwrap_type(self.src.raw(type_node))))
        return out

    def _blocks(self, caps: dict[str, list[Any]]) -> list[Block]:
        blocks = common.Blocks(self.src, self._scope_for, _FLOW_ENDS)
        add = blocks.add

        for node in caps.get("if", ()):
            cond = node.child_by_field_name("condition")
            add("if", node, node.child_by_field_name("consequence"), cond, node)
            alt = node.child_by_field_name("alternative")
            if alt is not None:
                body = alt.named_children[-1] if alt.named_child_count else None
                if body is not None and body.type != "if_statement":
                    add("else", node, body, None, node)
        for node in caps.get("loop", ()):
            test = node.child_by_field_name("condition")
            add("loop", node, node.child_by_field_name("body"), test, node)
        for node in caps.get("try", ()):
            add("try", node, node.child_by_field_name("body"), None, node)
        for node in caps.get("catch", ()):
            add("except", node, node.child_by_field_name("body"), None, node.parent)
        return blocks.in_order()


# ---------------------------------------------------------------- helpers


def _function_declarator(node: Any | None) -> Any | None:
    """The function_declarator under pointer/reference declarators."""
    for _ in range(8):
        if node is None:
            return None
        if node.type == "function_declarator":
            return node
        node = node.child_by_field_name("declarator")
    return None


def _declared_name(src: Source, node: Any | None) -> str:
    for _ in range(8):
        if node is None:
            return ""
        if node.type in ("identifier", "field_identifier"):
            return src.raw(node)
        if node.type == "structured_binding_declarator":
            return ",".join(src.raw(c) for c in node.named_children if c.type == "identifier")
        inner = node.child_by_field_name("declarator")
        if inner is None:
            inner = next((c for c in node.named_children if c.type in ("identifier", "field_identifier")), None)
        node = inner
    return ""


def _declarator_parts(src: Source, node: Any) -> tuple[str, str, tuple[Arg, ...] | None]:
    """(declared name, initialiser text, constructor args or None)."""
    if node.type == "init_declarator":
        name = _declared_name(src, node.child_by_field_name("declarator"))
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
    return _declared_name(src, node), "", None


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
        return _declared_name(src, parent.child_by_field_name("declarator")) or None
    if parent.type == "assignment_expression" and parent.child_by_field_name("right") == child:
        left = parent.child_by_field_name("left")
        return _strip_this(src.text(left)) if left is not None else None
    return None


def _unwrapped(node: Any) -> Any:
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


def extract_cpp(path: str, lang: Language, source: bytes, tree: Any, apis: ApiCatalog,
                grammar: Language | None = None) -> FileFacts:
    return _Extractor(path, lang, source, tree, apis).run(grammar or lang)
