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
from functools import cache
from typing import Any

import tree_sitter as ts

from ...catalog import ApiCatalog
from ...model import (
    Assign,
    Call,
    CallTable,
    FileFacts,
    Language,
    Scope,
    Site,
)
from ..parse import language
from . import common, constant_branches, cpp_meta, cpp_sites, cpp_statements, dead_code
from .common import Containers, Source
from .cpp_names import declared_name, function_declarator, strip_templates, unwrap_type

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
(field_initializer) @finit
(return_statement) @return
(if_statement) @if
(for_statement) @loop
(for_range_loop) @loop
(while_statement) @loop
(do_statement) @loop
(try_statement) @try
(catch_clause) @catch
"""

_DEFAULT_CAP = 80  # a parameter's default argument: a literal or a constant name is short
_STATEMENT_PARENTS = {"compound_statement", "translation_unit", "declaration_list", "field_declaration_list"}


@cache
def _query(grammar: Language) -> ts.Query:
    return ts.Query(language(grammar), _QUERY_TEXT)


class CppExtractor:
    def __init__(self, path: str, lang: Language, source: bytes, tree: Any, apis: ApiCatalog) -> None:
        self.path = path
        self.lang = lang
        self.src = Source(source)
        self.tree = tree
        self.apis = apis
        self.up = common.Ancestry(tree.root_node)
        self.dead = dead_code.Exits(source, self.up.ancestors, cpp=True)  # statements after a return/throw
        self.at = common.SiteAt(path, lang, _STATEMENT_PARENTS, tree.root_node.has_error, self.up.parent)
        self._registered: tuple[frozenset[str], frozenset[str]] | None = None
        # per (function start, pattern): the pattern's matches in the function's text, found once for the
        # sites that ask what is bound above them (cpp_sites.matches_above)
        self.body_matches: dict[tuple[int, str], tuple[str, list[re.Match[str]]] | None] = {}

    def run(self, grammar: Language) -> FileFacts:
        caps = common.ordered_captures(_query(grammar), self.tree.root_node)
        get = caps.get
        self._containers(get("def", []), get("class", []), get("ns", []), get("lambda", []))
        calls: list[Call] = []
        sites: list[Site] = []
        assigns: list[Assign] = []
        # declarations and assignments first: they record which calls are a
        # whole right-hand side (asking a node for its parent walks the tree)
        self.rhs_targets: dict[int, str] = {}
        cpp_sites.declarations(self, get("decl", []), calls, sites, assigns)
        cpp_statements.assignments(self, get("assign", []), assigns)
        cpp_statements.member_inits(self, get("finit", []), assigns)
        cpp_sites.calls(self, get("call", []), calls, sites)
        cpp_sites.news(self, get("new", []), calls, sites)
        # calls and sites in a branch on a function-local constant that cannot run (constant_branches)
        functions = get("def", []) + get("lambda", [])
        branches = constant_branches.ConstantBranches(self.src.data, get("if", []), functions, self.up, cpp=True)
        if branches.ranges:
            dead = [self.src.span(n) for n in branches.dead]
            calls = [c for c in calls if not any(d.contains(c.span) for d in dead)]
            sites = [s for s in sites if not any(d.contains(s.span) for d in dead)]
        meta = self.registered()[0]
        if meta:  # a Meta-key kernel allocates meta tensors: no memory
            sites = [s for s in sites if _function(s.scope) not in meta]
        sites.sort(key=lambda s: (s.span.line, s.span.col))
        assigns.sort(key=lambda a: a.line)
        comments = common.comment_nodes(self.tree.root_node, self.src.data)
        return FileFacts(
            path=self.path,
            language=self.lang,
            digest="",
            sites=tuple(cpp_sites.mark_static(cpp_sites.mark_exports(self, sites, calls), assigns)),
            scopes=tuple(self._scope_facts()),
            calls=CallTable.of(calls),
            assigns=tuple(assigns),
            returns=tuple(cpp_statements.returns(self, get("return", []))),
            blocks=tuple(cpp_statements.blocks(self, caps)),
            fields=tuple(cpp_statements.fields(self, get("field", []))),
            annotations=tuple(common.annotation_comments(self.src, comments, (b"//", b"/*", b"*"))),
            lines_of_code=self.src.data.count(b"\n") + (0 if self.src.data.endswith(b"\n") or not self.src.data else 1),
        )

    def registered(self) -> tuple[frozenset[str], frozenset[str]]:
        """Functions this file registers only for the Meta key, and only for
        host keys (CPU, ...): ``cpp_meta``. Read once per file."""
        if self._registered is None:
            self._registered = cpp_meta.meta_and_host_functions(self.src.data)
        return self._registered

    def host_functions(self) -> frozenset[str]:
        return self.registered()[1]

    # ------------------------------------------------------------ scopes
    def _containers(self, defs: list[Any], classes: list[Any], namespaces: list[Any], lambdas: list[Any]) -> None:
        entries: list[tuple[Any, str, Any, str]] = []  # node, kind, body, name
        for node in defs:
            body = node.child_by_field_name("body")
            declarator = function_declarator(node.child_by_field_name("declarator"))
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

    def kind_of(self, index: int) -> str:
        return self.entries[index][1] if index >= 0 else "module"

    def _owner(self, index: int) -> str | None:
        kind = self.kind_of(index)
        parent = self.containers.parent[index]
        if kind == "function":
            if parent >= 0 and self.kind_of(parent) == "class":
                return self.qualnames[parent]
            qual = self.qualnames[index]
            name = self.entries[index][3]
            if "::" in name:  # out-of-line definition `Foo::bar`
                return qual.rsplit("::", 1)[0]
            return None
        while parent >= 0:
            if self.kind_of(parent) == "class":
                return self.qualnames[parent]
            parent = self.containers.parent[parent]
        return None

    def _role(self, index: int, owner: str | None) -> str:
        kind = self.kind_of(index)
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
        for i, (node, kind, _body, name) in enumerate(self.entries):
            if kind == "namespace":
                continue
            owner = self._owner(i)
            params: list[str] = []
            types: list[str] = []
            defaults: list[str] = []
            kinds: list[str] = []
            variadic = False
            bases: list[str] = []
            if kind in ("function", "lambda"):
                if kind == "function":
                    declarator = function_declarator(node.child_by_field_name("declarator"))
                    plist = declarator.child_by_field_name("parameters") if declarator is not None else None
                else:
                    lam = node.child_by_field_name("declarator")
                    plist = lam.child_by_field_name("parameters") if lam is not None else None
                for p in plist.named_children if plist is not None else ():
                    if p.type in ("parameter_declaration", "optional_parameter_declaration"):
                        pname = declared_name(self.src, p.child_by_field_name("declarator"))
                        ptype = p.child_by_field_name("type")
                        params.append(pname or "")
                        types.append(unwrap_type(self.src.raw(ptype)) if ptype is not None else "")
                        default = p.child_by_field_name("default_value")
                        defaults.append(self.src.text(default, _DEFAULT_CAP) if default is not None else "")
                        kinds.append(_param_kind(self.src, p))
                    elif p.type in ("variadic_parameter_declaration", "variadic_parameter") or \
                            (not p.is_named and p.type == "..."):
                        variadic = True
                if plist is not None and any(c.type == "..." for c in plist.children):
                    variadic = True
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
                    param_defaults=tuple(defaults) if any(defaults) else (),
                    param_kinds="".join(kinds) + ("." if variadic else ""),
                    bases=tuple(bases),
                )
            )
        return out

    def scope_for(self, node: Any) -> str:
        """Qualified scope; code directly in a namespace or at file level is
        `<module>` (a namespace-qualified name when inside one)."""
        index = self.scope_index(node)
        if index >= 0 and self.kind_of(index) == "namespace":
            return self.qualnames[index]
        return self.scope_name(index)

    # ------------------------------------------------------------ calls and sites

    # ------------------------------------------------------------ other facts

# ---------------------------------------------------------------- helpers


def _function(scope: str) -> str:
    """The function a scope is in, by its last name (`f::<lambda>` -> `f`)."""
    while scope.endswith("::<lambda>"):
        scope = scope.removesuffix("::<lambda>")
    return scope.rsplit("::", 1)[-1]


def extract_cpp(path: str, lang: Language, source: bytes, tree: Any, apis: ApiCatalog,
                grammar: Language | None = None) -> FileFacts:
    return CppExtractor(path, lang, source, tree, apis).run(grammar or lang)


# builtin arithmetic types by name: no pointer (nor `nullptr`) converts to one
_NUMBER_TYPES = frozenset({
    "int", "unsigned", "signed", "short", "long", "float", "double", "char", "bool", "size_t", "ssize_t",
    "ptrdiff_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t",
    "std::size_t", "std::int32_t", "std::int64_t", "std::uint32_t", "std::uint64_t"})
_QUALIFIERS = frozenset({"const", "volatile", "unsigned", "signed", "long", "short"})


def _param_kind(src: Source, param: Any) -> str:
    """``Scope.param_kinds``' letter for one parameter declaration."""
    declarator = param.child_by_field_name("declarator")
    node = declarator
    for _ in range(8):  # `T* p`, `T p[]`, `T*& p`: a pointer; `const T& x`: what T is
        if node is None:
            break
        if node.type in ("pointer_declarator", "abstract_pointer_declarator", "array_declarator",
                         "abstract_array_declarator"):
            return "p"
        node = node.child_by_field_name("declarator") or (
            node.named_children[-1] if node.type in ("reference_declarator", "abstract_reference_declarator")
            and node.named_child_count else None)
    ptype = param.child_by_field_name("type")
    text = " ".join(src.raw(ptype).split()) if ptype is not None else ""
    if "nullptr_t" in text or "_ptr<" in text or text.endswith("_ptr"):
        return "p"
    words = [w for w in text.split() if w not in _QUALIFIERS] or [w for w in text.split() if w != "const"]
    return "n" if len(words) == 1 and (words[0] in _NUMBER_TYPES or words[0] in _QUALIFIERS) else "o"
