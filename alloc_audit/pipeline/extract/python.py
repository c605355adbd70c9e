"""Stage 3, extract (Python): tree-sitter tree -> FileFacts.

One tree-sitter query finds every node of interest in C; Python then visits
only those nodes. Every captured node gets its enclosing scope from a single
sweep over the scope ranges (``nodes.Containers``), so nothing here recurses
over the tree. Import aliases are resolved while callees are read, so
``import torch as T; T.empty(...)`` is ``torch.empty``.
"""

from __future__ import annotations

import re
from typing import Any

import tree_sitter as ts

from ...catalog import ApiCatalog
from ...model import (
    Arg,
    FileFacts,
    Import,
    Language,
    Scope,
)
from ..names import IDENTIFIER
from ..parse import language
from . import (
    common,
    constant_branches,
    dead_code,
    python_empty,
    python_fake,
    python_host_kernel,
    python_host_tests,
    python_kept,
    python_runtime,
    python_sites,
    python_statements,
    python_tensorless,
    python_typeonly,
)
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
_GETATTR_SELF = re.compile(r"getattr\(\s*self\s*,\s*[A-Za-z_]\w*\s*\)")

_STATEMENT_PARENTS = ("block", "module")
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


class PythonExtractor:
    def __init__(self, path: str, source: bytes, tree: Any, apis: ApiCatalog) -> None:
        self.path = path
        self.src = Source(source)
        self.tree = tree
        self.apis = apis
        self.module = module_name(path)
        self.aliases: dict[str, str] = {}
        self.bound = python_runtime.Names()  # modules `import` binds, names bound at module level (python_runtime)
        self.up = common.Ancestry(tree.root_node)
        self.kept_memo = python_kept.SourceIndex()
        self.at = common.SiteAt(path, Language.PYTHON, _STATEMENT_PARENTS, tree.root_node.has_error, self.up.parent)
        self.host_locals: frozenset[tuple[str, str]] = frozenset()  # (scope, name) of "cpu" locals: python_statements
        self.fake_file = python_fake.may_have_fake_scopes(source)  # fake/meta impls, a FakeTensorMode (python_fake)
        self.host_kernel_file = python_host_kernel.may_have_host_kernels(source)
        self.gpus_hidden = python_host_tests.gpus_hidden_file(source)  # `CUDA_VISIBLE_DEVICES = ""` at import
        self.empty_guard_file = python_empty.may_have_empty_guards(source)
        self.storage_file = python_tensorless.may_wrap_storage(source)
        # copies of host tensors only: a host test file, a converter loading on the host
        self.host_test_file = python_host_tests.host_test_file(path, source) \
            or python_host_tests.host_loaded_file(source)
        self.type_level = python_typeonly.type_level_file(path, tree.root_node)  # type-checker-only code
        self.type_checking_file = python_typeonly.type_checking_file(source)  # `if TYPE_CHECKING:`
        self.dead = dead_code.Exits(source, self.up.ancestors)  # statements after an unconditional raise/return
        self.fake_aliases: frozenset[str] | None = None  # names bound to a fake-impl decorator (python_fake)
        # (function or class start, receiver) -> whether the code uses it as a module (python_module_move, _use)
        self.module_uses: dict[tuple[int, str], bool] = {}
        self.module_used: dict[tuple[int, str], bool] = {}
        self.default_sources: dict[tuple[int, str], bool] = {}  # (function start, name): python_host.default_source
        self.device_flows: dict[int, Any] = {}  # function start (-1: the module): python_device_flow's walk
        self.device_returns: dict[tuple[Any, ...], Any] = {}  # python_device_returns: the file's defs, summaries

    # ------------------------------------------------------------ entry point
    def run(self) -> FileFacts:
        caps = common.ordered_captures(_get_query(), self.tree.root_node)
        get = caps.get
        imports = self._imports(get("import", []))
        self._scopes(get("def", []), get("class", []), get("lambda", []))
        _yields(self, get("yield", []))
        self.rhs_targets: dict[int, str] = {}
        assigns = python_statements.assigns(self, get("assign", []), get("augassign", []), get("del", []))
        self.host_locals = python_statements.host_locals(assigns, {
            (self.scope_name(self.containers.innermost(start)), name) for start, name in self.rhs_targets.items()})
        # calls in a branch on a function-local constant that cannot run (constant_branches)
        branches = constant_branches.ConstantBranches(self.src.data, get("if", []), get("def", []), self.up)
        call_nodes = [n for n in get("call", []) if not branches.holds(n)] if branches.ranges else get("call", [])
        calls, sites = python_sites.calls(self, call_nodes, get("with", []))
        returns = python_statements.returns(self, get("return", []))
        sites = python_kept.mark_kept(self, sites, assigns, returns, calls)
        # factories without a device: host tensors, unless a default-device
        # context is in force where they run (decided by stage default_device)
        defaults = [s for s in sites if s.device == python_sites.DEFAULT_DEVICE]
        sites = [s for s in sites if s.device != python_sites.DEFAULT_DEVICE]
        comments = common.comment_nodes(self.tree.root_node, self.src.data)
        facts = FileFacts(
            path=self.path,
            language=Language.PYTHON,
            digest="",
            module=self.module,
            sites=tuple(sorted(python_sites.mark_handed(self, python_sites.mark_exports(self, sites, calls), calls),
                               key=lambda s: (s.span.line, s.span.col))),
            scopes=tuple(self._scope_facts()),
            calls=calls,
            assigns=tuple(assigns),
            returns=tuple(returns),
            blocks=tuple(python_statements.blocks(self, caps)),
            withs=tuple(python_statements.withs(self, get("with", []))),
            default_sites=tuple(sorted(python_sites.mark_handed(self, defaults, calls),
                                       key=lambda s: (s.span.line, s.span.col))),
            imports=tuple(imports),
            annotations=tuple(common.annotation_comments(self.src, comments, b"#")),
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
                    else:
                        continue  # a broken statement (`import torc n):` parses with an error child)
                    self.bound.modules.add(out[-1].name)
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
        m = IDENTIFIER.match(expr)
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
        body_id, name_id = common.field_ids(Language.PYTHON, "body", "name")
        for node, kind in nodes:
            body = node.child_by_field_id(body_id)
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
                name_node = node.child_by_field_id(name_id)
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

    def _scope_facts(self) -> list[Scope]:
        out: list[Scope] = []
        parameters_id, return_type_id, body_id, superclasses_id, *fields = common.field_ids(
            Language.PYTHON, "parameters", "return_type", "body", "superclasses", "name", "type", "value")
        for i, (node, kind) in enumerate(self.scope_nodes):
            params: list[str] = []
            types: list[str] = []
            defaults: list[str] = []
            decorators: list[str] = []
            bases: list[str] = []
            doc = ""
            returns_type = None
            if kind in ("function", "lambda"):
                params, types, defaults = _parameters(self.src, node.child_by_field_id(parameters_id), fields)
                if kind == "function":
                    rt = node.child_by_field_id(return_type_id)
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
                doc = _docstring(self.src, node.child_by_field_id(body_id))
            if kind == "class":
                supers = node.child_by_field_id(superclasses_id)
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
                    param_defaults=tuple(defaults) if any(defaults) else (),
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
            # a name longer than the 200-byte cap is cut: its last name comes
            # from the attribute node below, not from the cut text
            if (flat is raw or _DOTTED.fullmatch(flat)) and "." in flat:
                dotted = self.resolve(flat)
                return dotted, dotted, flat.rsplit(".", 1)[1]
            obj = fn.child_by_field_name("object")
            attr = fn.child_by_field_name("attribute")
            leaf = self.src.raw(attr) if attr is not None else ""
            if obj is not None and obj.type == "call":
                inner = obj.child_by_field_name("function")
                if inner is not None and inner.type == "identifier" and self.src.raw(inner) == "super":
                    return f"super().{leaf}", None, leaf
            if obj is not None and (obj.type in ("identifier", "attribute") or _member_by_name(self, obj)):
                return f"{self.src.text(obj, 80)}.{leaf}", None, leaf
            return f"(...).{leaf}", None, leaf
        if fn.type == "subscript":
            # a ctypes function table: `self.funcs["cudaMalloc"](...)` calls
            # the function the string names
            key = fn.child_by_field_name("subscript")
            literal = python_sites.STRING_LITERAL.match(self.src.raw(key, 80)) if key is not None else None
            if literal is not None and literal.group(2).isidentifier():
                return self.src.text(fn, 80), None, literal.group(2)
        return self.src.text(fn, 80), None, ""

    # ------------------------------------------------------------ other facts

    def with_items(self, node: Any) -> list[tuple[str, tuple[Arg, ...], str | None]]:
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
                listed = args_node is not None and args_node.type == "argument_list"
                args = python_sites.call_args(self.src, args_node) if listed else ()
                items.append((callee, args, alias))
            else:
                items.append((self.resolve(self.src.text(value)), (), alias))
        return items

# ---------------------------------------------------------------- helpers


def _parameters(src: Source, node: Any | None, fields: list[int]) -> tuple[list[str], list[str], list[str]]:
    """The names, type texts and default texts ("" for none) of the parameters ``node`` lists; ``fields``:
    the ids of the fields ``name``, ``type`` and ``value``."""
    params: list[str] = []
    types: list[str] = []
    defaults: list[str] = []
    for p in node.named_children if node is not None else ():
        name, type_text = _param(src, p, fields)
        if name:
            params.append(name)
            types.append(type_text)
            value = p.child_by_field_id(fields[2]) if p.type.endswith("default_parameter") else None
            defaults.append(src.text(value) if value is not None else "")
    return params, types, defaults


def _param(src: Source, node: Any, fields: list[int]) -> tuple[str, str]:
    """A parameter's name and type text; ``fields``: the ids of the fields ``name`` and ``type`` first."""
    t = node.type
    if t == "identifier":
        return src.raw(node), ""
    if t in ("typed_parameter", "typed_default_parameter", "default_parameter"):
        name = node.child_by_field_id(fields[0])
        if name is None:
            name = next((c for c in node.named_children if c.type == "identifier"), None)
        type_node = node.child_by_field_id(fields[1])
        return (src.raw(name) if name is not None else ""), (src.text(type_node) if type_node is not None else "")
    if t in ("list_splat_pattern", "dictionary_splat_pattern"):
        inner = next((c for c in node.named_children if c.type == "identifier"), None)
        prefix = "*" if t == "list_splat_pattern" else "**"
        return (prefix + src.raw(inner)) if inner is not None else "", ""
    return "", ""


def _docstring(src: Source, body: Any | None) -> str:
    if body is None or not body.named_child_count:
        return ""
    first = body.named_child(0)  # not named_children[0]: that lists every statement of the body
    string = first.named_child(0) if first.type == "expression_statement" and first.named_child_count else None
    if string is not None and string.type == "string":
        raw = src.raw(string, 400).strip("rRbBuU").strip("\"'").strip()
        return raw.splitlines()[0].strip() if raw else ""
    return ""




def _yields(ext: PythonExtractor, nodes: list[Any]) -> None:
    """The lines of each function's `yield`s (a lambda's count for the function around it)."""
    for node in nodes:
        index = ext.scope_of(node)
        while index >= 0 and ext.kinds[index] == "lambda":
            index = ext.containers.parent[index]
        if index >= 0:
            ext.yield_lines.setdefault(index, []).append(node.start_point[0] + 1)


def extract_python(path: str, source: bytes, tree: Any, apis: ApiCatalog) -> FileFacts:
    return PythonExtractor(path, source, tree, apis).run()


def _member_by_name(ext: PythonExtractor, obj: Any) -> bool:
    """``getattr(self, NAME)``: a member the object holds, named by a
    constant (``getattr(self, PREDICTIONS).append(...)`` shows as written)."""
    return bool(obj.type == "call" and _GETATTR_SELF.fullmatch(ext.src.raw(obj, 80)))
