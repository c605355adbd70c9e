"""Stage 3, extract (Python): tree-sitter tree -> FileFacts.

One tree-sitter query finds every node of interest in C; Python then visits
only those nodes. Every captured node gets its enclosing scope from a single
sweep over the scope ranges (``nodes.Containers``), so nothing here recurses
over the tree. Import aliases are resolved while callees are read, so
``import torch as T; T.empty(...)`` is ``torch.empty``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import tree_sitter as ts

from ...arglists import split_args, split_top_level
from ...catalog import ApiCatalog, ApiSpec
from ...model import (
    Arg,
    Assign,
    Block,
    CallTable,
    FileFacts,
    Import,
    Language,
    Return,
    Scope,
    Site,
    SiteKind,
    With,
    WithItem,
)
from ..parse import language
from . import common
from .common import Containers, Source

_QUERY_TEXT = """
(function_definition) @def
(class_definition) @class
(lambda) @lambda
(call) @call
(assignment) @assign
(augmented_assignment) @augassign
(delete_statement) @del
(with_statement) @with
(if_statement) @if
(elif_clause) @elif
(else_clause) @else
(for_statement) @loop
(while_statement) @loop
(try_statement) @try
(except_clause) @except
(finally_clause) @finally
(return_statement) @return
(yield) @yield
(import_statement) @import
(import_from_statement) @import
"""

_query: ts.Query | None = None
_DOTTED = re.compile(r"[A-Za-z_][\w.]*")
ARGLIST_CAP = 400

_FLOW_ENDS = {"return_statement", "raise_statement", "continue_statement", "break_statement"}
_STATEMENT_PARENTS = ("block", "module")
_STRING_LITERAL = re.compile(r"""^[rbuRBU]{0,2}(['"])(.*)\1$""", re.S)
_FSTRING = re.compile(r"""^[fF][rR]?(['"])(.*)\1$""", re.S)
_CONSTRUCTORS = {"__init__", "__new__", "__post_init__"}


def _get_query() -> ts.Query:
    global _query
    if _query is None:
        _query = ts.Query(language(Language.PYTHON), _QUERY_TEXT)
    return _query


def module_name(path: str) -> str:
    """``pkg/sub/mod.py`` -> ``pkg.sub.mod``; ``pkg/__init__.py`` -> ``pkg``."""
    parts = path[:-3].split("/") if path.endswith(".py") else path.split("/")
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


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


class _Extractor:
    def __init__(self, path: str, source: bytes, tree: Any, apis: ApiCatalog) -> None:
        self.path = path
        self.src = Source(source)
        self.tree = tree
        self.apis = apis
        self.module = module_name(path)
        self.aliases: dict[str, str] = {}
        self.at = common.SiteAt(path, Language.PYTHON, _STATEMENT_PARENTS, tree.root_node.has_error)

    # ------------------------------------------------------------ entry point
    def run(self) -> FileFacts:
        caps = common.ordered_captures(_get_query(), self.tree.root_node)
        get = caps.get
        imports = self._imports(get("import", ()))
        self._scopes(get("def", ()), get("class", ()), get("lambda", ()))
        self._yields(get("yield", ()))
        self.rhs_targets: dict[int, str] = {}
        assigns = self._assigns(get("assign", ()), get("augassign", ()), get("del", ()))
        calls, sites = self._calls(get("call", ()), get("with", ()))
        facts = FileFacts(
            path=self.path,
            language=Language.PYTHON,
            digest="",
            module=self.module,
            sites=tuple(sorted(self._mark_handed(self._mark_exports(sites, calls), calls),
                               key=lambda s: (s.span.line, s.span.col))),
            scopes=tuple(self._scope_facts()),
            calls=calls,
            assigns=tuple(assigns),
            returns=tuple(self._returns(get("return", ()))),
            blocks=tuple(self._blocks(caps)),
            withs=tuple(self._withs(get("with", ()))),
            imports=tuple(imports),
            annotations=tuple(common.annotations(self.src, common.comment_nodes(self.tree.root_node, self.src.data), b"#")),
            lines_of_code=self.src.data.count(b"\n") + (0 if self.src.data.endswith(b"\n") or not self.src.data else 1),
        )
        return facts

    # ------------------------------------------------------------ imports
    def _imports(self, nodes: list[Any]) -> list[Import]:
        out: list[Import] = []
        package = self.module if self.path.endswith("__init__.py") else self.module.rpartition(".")[0]
        for node in nodes:
            line = node.start_point[0] + 1
            if node.type == "import_statement":
                for child in node.named_children:
                    if child.type == "aliased_import":
                        target = self.src.raw(child.child_by_field_name("name"))
                        out.append(Import(self.src.raw(child.child_by_field_name("alias")), target, line))
                    elif child.type == "dotted_name":
                        dotted = self.src.raw(child)
                        out.append(Import(dotted.split(".")[0], dotted.split(".")[0], line))
                continue
            module_node = node.child_by_field_name("module_name")
            if module_node is None:
                continue
            base = self.src.raw(module_node)
            if module_node.type == "relative_import":
                dots = len(base) - len(base.lstrip("."))
                rest = base[dots:]
                anchor = package.split(".") if package else []
                if dots > 1:
                    anchor = anchor[: len(anchor) - (dots - 1)] if dots - 1 <= len(anchor) else []
                base = ".".join([*anchor, rest] if rest else anchor)
            for child in node.children_by_field_name("name"):
                if child.type == "aliased_import":
                    name = self.src.raw(child.child_by_field_name("name"))
                    alias = self.src.raw(child.child_by_field_name("alias"))
                else:
                    name = alias = self.src.raw(child)
                out.append(Import(alias, f"{base}.{name}" if base else name, line))
        for imp in out:
            self.aliases.setdefault(imp.name, imp.target)
        return out

    def resolve_text(self, expr: str) -> str:
        """Resolve an alias at the head of an expression (`T.device("cuda")`)."""
        m = re.match(r"[A-Za-z_]\w*", expr)
        if m is None or m.group(0) not in self.aliases:
            return expr
        return self.aliases[m.group(0)] + expr[m.end():]

    def resolve(self, dotted: str) -> str:
        head, dot, rest = dotted.partition(".")
        target = self.aliases.get(head)
        if target is None:
            return dotted
        return f"{target}{dot}{rest}"

    # ------------------------------------------------------------ scopes
    def _scopes(self, defs: list[Any], classes: list[Any], lambdas: list[Any]) -> None:
        nodes: list[tuple[Any, str]] = [(n, "function") for n in defs]
        nodes += [(n, "class") for n in classes] + [(n, "lambda") for n in lambdas]
        ranges: list[tuple[int, int]] = []
        kept: list[tuple[Any, str]] = []
        for node, kind in nodes:
            body = node.child_by_field_name("body")
            if body is None:
                continue
            ranges.append((body.start_byte, node.end_byte))
            kept.append((node, kind))
        self.scope_nodes = kept
        self.containers = Containers(ranges)
        n = len(kept)
        self.qualnames: list[str] = [""] * n
        self.kinds: list[str] = [k for _, k in kept]
        self.names: list[str] = []
        for node, kind in kept:
            if kind == "lambda":
                self.names.append("<lambda>")
            else:
                name_node = node.child_by_field_name("name")
                self.names.append(self.src.raw(name_node) if name_node is not None else "?")
        # parents come before children in start order, so one pass fills qualnames
        for i in sorted(range(n), key=lambda i: ranges[i][0]):
            parent = self.containers.parent[i]
            self.qualnames[i] = f"{self.qualnames[parent]}.{self.names[i]}" if parent >= 0 else self.names[i]
        self.yield_lines: dict[int, list[int]] = {}

    def scope_of(self, node: Any) -> int:
        return self.containers.innermost(node.start_byte)

    def scope_name(self, index: int) -> str:
        return self.qualnames[index] if index >= 0 else "<module>"

    def _owner(self, index: int) -> str | None:
        parent = self.containers.parent[index] if index >= 0 else -1
        while parent >= 0:
            if self.kinds[parent] == "class":
                return self.qualnames[parent]
            parent = self.containers.parent[parent]
        return None

    def _role(self, index: int) -> str:
        kind = self.kinds[index]
        if kind in ("class", "lambda"):
            return kind
        parent = self.containers.parent[index]
        if parent >= 0 and self.kinds[parent] == "class":
            if self.names[index] in _CONSTRUCTORS:
                return "constructor"
            return "destructor" if self.names[index] == "__del__" else "method"
        return "function"

    def _yields(self, nodes: list[Any]) -> None:
        for node in nodes:
            index = self.scope_of(node)
            while index >= 0 and self.kinds[index] == "lambda":
                index = self.containers.parent[index]
            if index >= 0:
                self.yield_lines.setdefault(index, []).append(node.start_point[0] + 1)

    def _scope_facts(self) -> list[Scope]:
        out: list[Scope] = []
        for i, (node, kind) in enumerate(self.scope_nodes):
            params: list[str] = []
            types: list[str] = []
            decorators: list[str] = []
            bases: list[str] = []
            doc = ""
            returns_type = None
            if kind in ("function", "lambda"):
                params_node = node.child_by_field_name("parameters")
                for p in params_node.named_children if params_node is not None else ():
                    name, type_text = _param(self.src, p)
                    if name:
                        params.append(name)
                        types.append(type_text)
                if kind == "function":
                    rt = node.child_by_field_name("return_type")
                    returns_type = self.src.text(rt) if rt is not None else None
            if kind in ("function", "class"):
                parent = node.parent
                if parent is not None and parent.type == "decorated_definition":
                    for d in parent.named_children:
                        if d.type == "decorator" and d.named_child_count:
                            expr = d.named_children[0]
                            if expr.type == "call":
                                expr = expr.child_by_field_name("function")
                            decorators.append(self.resolve(self.src.text(expr)))
                doc = _docstring(self.src, node.child_by_field_name("body"))
            if kind == "class":
                supers = node.child_by_field_name("superclasses")
                for b in supers.named_children if supers is not None else ():
                    if b.type != "keyword_argument":
                        bases.append(self.resolve(self.src.text(b)))
            out.append(
                Scope(
                    qualname=self.qualnames[i],
                    name=self.names[i],
                    kind=kind,
                    role=self._role(i),
                    span=self.src.span(node),
                    owner=self._owner(i),
                    params=tuple(params),
                    param_types=tuple(types),
                    decorators=tuple(decorators),
                    bases=tuple(bases),
                    yields=tuple(self.yield_lines.get(i, ())),
                    doc=doc,
                    returns_type=returns_type,
                )
            )
        return out

    # ------------------------------------------------------------ calls and sites
    def callee_of(self, fn: Any) -> tuple[str, str | None, str]:
        """(display callee, resolved dotted name or None, last name), read
        from the source text: `torch . empty` -> torch.empty; a call or
        parenthesised receiver shows as `(...)`, and `super()` stays."""
        raw = self.src.raw(fn, 200)
        if fn.type == "identifier":
            dotted = self.resolve(raw)
            return dotted, dotted, raw
        if fn.type == "attribute":
            # `torch.empty` as written, mostly; else without spaces and line breaks
            flat = raw if _DOTTED.fullmatch(raw) else \
                raw.replace(" ", "").replace("\n", "").replace("\t", "").replace("\\", "")
            if flat is raw or _DOTTED.fullmatch(flat):
                dotted = self.resolve(flat)
                return dotted, dotted, flat.rsplit(".", 1)[1]
            obj = fn.child_by_field_name("object")
            attr = fn.child_by_field_name("attribute")
            leaf = self.src.raw(attr) if attr is not None else ""
            if obj is not None and obj.type == "call":
                inner = obj.child_by_field_name("function")
                if inner is not None and inner.type == "identifier" and self.src.raw(inner) == "super":
                    return f"super().{leaf}", None, leaf
            if obj is not None and obj.type in ("identifier", "attribute") :
                return f"{self.src.text(obj, 80)}.{leaf}", None, leaf
            return f"(...).{leaf}", None, leaf
        return self.src.text(fn, 80), None, ""

    def _calls(self, call_nodes: list[Any], with_nodes: list[Any]) -> tuple[CallTable, list[Site]]:
        scopes: list[str] = []
        callees: list[str] = []
        arglists: list[str] = []
        targets: list[str | None] = []
        positions: list[int] = []
        sites: list[Site] = []
        apis = self.apis
        names, leaves, methods = apis.py_names, apis.py_leaf, apis.py_methods
        device_ranges = self._default_device_ranges(with_nodes)
        src = self.src
        data = src.data
        innermost = self.containers.innermost
        qualnames = self.qualnames
        aliases = self.aliases
        span_of = src.span
        col = src.col
        ascii_file = src.ascii
        wide_rows = src.wide_rows()
        rhs_targets = self.rhs_targets
        for node in call_nodes:
            kids = node.children
            if len(kids) < 2:
                continue
            fn, args_node = kids[0], kids[-1]
            fn_type = fn.type
            if fn_type == "identifier":
                raw = data[fn.start_byte:fn.end_byte].decode("utf-8", "replace")
                dotted = aliases.get(raw, raw)
                callee, leaf = dotted, raw
            else:
                callee, dotted, leaf = self.callee_of(fn)
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
            args = _args(src, args_node) if args_node.type == "argument_list" else ()
            if target is None:
                target = _target_of(node, src)  # a method chain on the allocation
            site = self._site(node, spec, scope, span_of(node), args, target, device_ranges)
            if site is not None:
                sites.append(site)
        return CallTable(tuple(scopes), tuple(callees), tuple(arglists), tuple(targets), tuple(positions)), sites

    def _default_device_ranges(self, with_nodes: list[Any]) -> list[tuple[int, int, str]]:
        """Bodies of `with torch.device("cuda"):` and the device they set."""
        out = []
        contexts = self.apis.py_device_contexts
        for node in with_nodes:
            for callee, args, _alias in self._with_items(node):
                positional = [a.text for a in args if a.keyword is None]
                if callee in contexts and positional:
                    body = node.child_by_field_name("body")
                    if body is not None:
                        out.append((body.start_byte, body.end_byte, classify_device(positional[0])))
        return out

    def _site(self, node: Any, spec: ApiSpec, scope: str, span: Any, args: tuple[Arg, ...],
              target: str | None, device_ranges: list[tuple[int, int, str]]) -> Site | None:
        kwargs = {a.keyword: self.resolve_text(a.text) for a in args if a.keyword}
        positional = [self.resolve_text(a.text) for a in args if a.keyword is None]
        kind = spec.kind
        device: str | None = None
        mode = spec.device
        if mode in ("keyword", "inherit"):
            pin = kwargs.get("pin_memory")
            dev_text = kwargs.get("device")
            if pin is not None and pin.strip() != "False":
                kind, device = SiteKind.PINNED_HOST, "cpu" if pin.strip() == "True" else "cpu (pinned if " + pin.strip() + ")"
            elif dev_text is None:
                ctx = [d for s, e, d in device_ranges if s <= node.start_byte < e]
                if ctx:
                    device = ctx[-1]
                else:
                    device = None if mode == "keyword" else "unknown"
                if device in (None, "cpu", "meta"):
                    return None
            else:
                device = classify_device(dev_text)
                if device in ("cpu", "meta"):
                    return None
        elif mode == "to-args":
            candidates = [*positional[:1], kwargs.get("device", "")]
            if not any(classify_device(c) == "cuda" for c in candidates if c):
                return None
            device = "cuda"
        elif mode == "cuda":
            device = "cuda"
        shape, size = _shape(spec.shape, positional, kwargs)
        if spec.target.startswith("arg:"):
            index = int(spec.target[4:])
            if len(positional) > max(index, 1):
                target = _strip_byref(positional[index])
            else:  # cuda-python returns the pointer: `err, ptr = cudart.cudaMalloc(n)`
                shape, size = ((positional[-1],), positional[-1]) if positional else ((), None)
                if target and "," in target:
                    target = target.rsplit(",", 1)[1].strip()
        return self.at.site(node, spec.api, kind, scope, span, size, shape, device, target, self._wrapper(node),
                            dtype=kwargs.get("dtype"))

    def _wrapper(self, node: Any) -> str | None:
        """The callee the allocation is passed to as an argument, if any."""
        fn = common.wrapping_call(node, "call", "keyword_argument")
        return self.callee_of(fn)[0] if fn is not None else None

    def _mark_handed(self, sites: list[Site], calls: CallTable) -> list[Site]:
        """An allocation kept in a local and then passed whole to a call in
        the same scope is handed to that call, as if wrapped by it
        (`w = torch.empty(...)` ... `self.register_all_parameters(w)` is
        `nn.Parameter(torch.empty(...))` in two steps): the first such call
        after it becomes its ``wrapper``."""
        pending = [s for s in sites if s.wrapper is None and s.target and s.target.isidentifier()]
        if not pending:
            return sites
        wanted = {s.scope for s in pending}
        by_scope: dict[str, list[int]] = {}
        for i, scope in enumerate(calls.scopes):
            if scope in wanted:
                by_scope.setdefault(scope, []).append(i)
        handed: dict[int, str] = {}
        for site in pending:
            for i in by_scope.get(site.scope, ()):
                arglist = calls.arglists[i]
                if site.target not in arglist or calls.line(i) <= site.span.end_line:
                    continue
                if site.target in {a.text for a in split_args(arglist, False)}:
                    handed[id(site)] = calls.callees[i]
                    break
        return [dataclasses.replace(s, wrapper=handed[id(s)]) if id(s) in handed else s for s in sites]

    def _mark_exports(self, sites: list[Site], calls: CallTable) -> list[Site]:
        """A site whose memory is passed to an export call in its scope is IPC."""
        exports = self.apis.py_exports
        if not exports or not sites:
            return sites
        exported: dict[str, set[str]] = {}
        for i, callee in enumerate(calls.callees):
            if callee.rsplit(".", 1)[-1] in exports:
                words = set(re.findall(r"[A-Za-z_][\w.]*", calls.arglists[i]))
                words.add(callee.rsplit(".", 1)[0])
                exported.setdefault(calls.scopes[i], set()).update(words)
        return common.mark_exported(sites, exported) if exported else sites

    # ------------------------------------------------------------ other facts
    def _assigns(self, assigns: list[Any], augs: list[Any], dels: list[Any]) -> list[Assign]:
        """Assignments, and (in ``rhs_targets``) the target of every call that
        is a whole right-hand side: such assignments are recorded as the
        call's target instead (asking a node for its parent walks the tree)."""
        out: list[Assign] = []
        rhs = self.rhs_targets
        for node in assigns:
            left = node.child_by_field_name("left")
            right = node.child_by_field_name("right")
            type_node = node.child_by_field_name("type")
            if left is None:
                continue
            if right is not None and right.type == "call":
                rhs[right.start_byte] = self.src.text(left)
                if type_node is None:
                    continue
            if right is not None and right.type == "conditional_expression":
                # `out = output if output is not None else torch.empty(...)`
                branches = right.named_children
                for branch in (branches[0], branches[-1]) if len(branches) >= 3 else ():
                    if branch.type == "call":
                        rhs[branch.start_byte] = self.src.text(left)
            if left.type in ("pattern_list", "tuple_pattern", "list_pattern"):
                targets = tuple(self.src.text(c) for c in left.named_children)
            else:
                targets = (self.src.text(left),)
            out.append(
                Assign(
                    scope=self.scope_name(self.scope_of(node)),
                    line=node.start_point[0] + 1,
                    targets=targets,
                    value=self.src.text(right) if right is not None else "",
                    type=self.src.text(type_node) if type_node is not None else None,
                )
            )
        for node in augs:
            left = node.child_by_field_name("left")
            right = node.child_by_field_name("right")
            op = node.child_by_field_name("operator")
            out.append(
                Assign(
                    scope=self.scope_name(self.scope_of(node)),
                    line=node.start_point[0] + 1,
                    targets=(self.src.text(left),),
                    value=self.src.text(right) if right is not None else "",
                    op=self.src.raw(op) if op is not None else "+=",
                )
            )
        for node in dels:
            targets: list[str] = []
            for child in node.named_children:
                if child.type == "expression_list":
                    targets += [self.src.text(c) for c in child.named_children]
                else:
                    targets.append(self.src.text(child))
            out.append(Assign(self.scope_name(self.scope_of(node)), node.start_point[0] + 1, tuple(targets), "", "del"))
        out.sort(key=lambda a: a.line)
        return out

    def _returns(self, nodes: list[Any]) -> list[Return]:
        out = []
        for node in nodes:
            value = node.named_children[0] if node.named_child_count else None
            out.append(Return(self.scope_name(self.scope_of(node)), node.start_point[0] + 1,
                              self.src.text(value) if value is not None else ""))
        return out

    def _blocks(self, caps: dict[str, list[Any]]) -> list[Block]:
        blocks = common.Blocks(self.src, lambda node: self.scope_name(self.scope_of(node)), _FLOW_ENDS)
        add = blocks.add

        for node in caps.get("if", ()):
            add("if", node, node.child_by_field_name("consequence"), node.child_by_field_name("condition"), node)
        for node in caps.get("elif", ()):
            add("elif", node, node.child_by_field_name("consequence"), node.child_by_field_name("condition"),
                node.parent)
        for node in caps.get("else", ()):
            parent = node.parent
            kind = {"if_statement": "else", "try_statement": "try-else"}.get(parent.type, "loop-else")
            add(kind, node, node.child_by_field_name("body"), None, parent)
        for node in caps.get("loop", ()):
            test = node.child_by_field_name("condition") or node.child_by_field_name("right")
            add("loop", node, node.child_by_field_name("body"), test, node)
        for node in caps.get("try", ()):
            add("try", node, node.child_by_field_name("body"), None, node)
        for node in caps.get("except", ()):
            body = next((c for c in node.named_children if c.type == "block"), None)
            add("except", node, body, None, node.parent)
        for node in caps.get("finally", ()):
            body = next((c for c in node.named_children if c.type == "block"), None)
            add("finally", node, body, None, node.parent)
        return blocks.in_order()

    def _with_items(self, node: Any) -> list[tuple[str, tuple[Arg, ...], str | None]]:
        items = []
        clause = next((c for c in node.named_children if c.type == "with_clause"), None)
        for item in clause.named_children if clause is not None else ():
            value = item.child_by_field_name("value")
            if value is None:
                continue
            alias = None
            if value.type == "as_pattern":
                target = value.child_by_field_name("alias")
                alias = self.src.text(target) if target is not None else None
                value = value.named_children[0]
            if value.type == "call":
                fn = value.child_by_field_name("function")
                callee = self.callee_of(fn)[0] if fn is not None else self.src.text(value)
                args_node = value.child_by_field_name("arguments")
                args = _args(self.src, args_node) if args_node is not None and args_node.type == "argument_list" else ()
                items.append((callee, args, alias))
            else:
                items.append((self.resolve(self.src.text(value)), (), alias))
        return items

    def _withs(self, nodes: list[Any]) -> list[With]:
        out = []
        for node in nodes:
            body = node.child_by_field_name("body")
            if body is None:
                continue
            items = tuple(WithItem(callee, args, alias) for callee, args, alias in self._with_items(node))
            out.append(With(self.scope_name(self.scope_of(node)), self.src.span(node), self.src.span(body), items))
        return out


# ---------------------------------------------------------------- helpers


def _param(src: Source, node: Any) -> tuple[str, str]:
    t = node.type
    if t == "identifier":
        return src.raw(node), ""
    if t in ("typed_parameter", "typed_default_parameter", "default_parameter"):
        name = node.child_by_field_name("name")
        if name is None:
            name = next((c for c in node.named_children if c.type == "identifier"), None)
        type_node = node.child_by_field_name("type")
        return (src.raw(name) if name is not None else ""), (src.text(type_node) if type_node is not None else "")
    if t in ("list_splat_pattern", "dictionary_splat_pattern"):
        inner = next((c for c in node.named_children if c.type == "identifier"), None)
        prefix = "*" if t == "list_splat_pattern" else "**"
        return (prefix + src.raw(inner)) if inner is not None else "", ""
    return "", ""


def _docstring(src: Source, body: Any | None) -> str:
    if body is None or not body.named_child_count:
        return ""
    first = body.named_children[0]
    if first.type == "expression_statement" and first.named_child_count and first.named_children[0].type == "string":
        raw = src.raw(first.named_children[0], 400).strip("rRbBuU").strip("\"'").strip()
        return raw.splitlines()[0].strip() if raw else ""
    return ""


def _args(src: Source, node: Any) -> tuple[Arg, ...]:
    out = []
    for child in node.named_children:
        if child.type == "keyword_argument":
            name = child.child_by_field_name("name")
            value = child.child_by_field_name("value")
            out.append(Arg(src.raw(name) if name is not None else None, src.text(value) if value is not None else ""))
        elif child.type != "comment":
            out.append(Arg(None, src.text(child)))
    return tuple(out)


def _target_of(node: Any, src: Source) -> str | None:
    """The assignment target that receives a call's value: the call may be the
    right-hand side itself or the start of a method chain on it
    (``self.buf = torch.empty(n).view(a, b)``)."""
    child = node
    parent = node.parent
    while parent is not None:
        t = parent.type
        if t == "assignment":
            if parent.child_by_field_name("right") == child:
                left = parent.child_by_field_name("left")
                return src.text(left) if left is not None else None
            return None
        if t == "attribute" and parent.child_by_field_name("object") == child:
            child = parent
            parent = parent.parent
            if parent is not None and parent.type == "call" and parent.child_by_field_name("function") == child:
                child = parent
                parent = parent.parent
            continue
        if t in ("parenthesized_expression", "await"):
            child, parent = parent, parent.parent
            continue
        return None
    return None


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


def extract_python(path: str, source: bytes, tree: Any, apis: ApiCatalog) -> FileFacts:
    return _Extractor(path, source, tree, apis).run()
