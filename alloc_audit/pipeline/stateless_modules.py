"""Stage 5, after ``module_classes``: a module move that moves nothing.

Input: sites (module moves told), the index. Output: the same sites less
the ``.to()`` / ``.cuda()`` of a module built right there or bound above
(``FusedSoftmax(scale=None, mask_func=mask_fn).cuda()``) whose project
class holds no tensors: it derives from ``nn.Module`` alone, no method of
it allocates on the device (within three calls), registers anything or keeps a call's value
on ``self`` (no parameter, buffer, sub-module or tensor), and every
argument the construction passes is a literal, ``None``, an enum-like
``Name.member``, a name of project functions or an imported name (nothing the object
could keep that holds memory). Moving such a module allocates nothing.
A class with a project base, a method that stores a call's value, or an
argument that is any other name stays a weight upload. A torch class the
shipped list names (rules/tiers.toml [modules] stateless: losses,
activations, pooling; `nn.L1Loss().to(device)`), built with such arguments,
moves nothing too (round 19). Round 25: what a move moves is the
module's parameters, buffers and sub-modules, and only a store into a
direct attribute (``self.x = ...``) or a registration can add one; so a
method's allocation it returns or drops (``Site.kept`` ``return`` or
``local``; one going anywhere else still holds), a store into an attribute of an
attribute (``self.ctx.out = gelu(...)``, on a plain object) and a
``torch.device(...)`` kept on ``self`` hold nothing the move copies. An
argument may also be a local bound only to a construction of a project class
with no base (a plain context object, ``ctx = MoeCtx()``). A value stored
on ``self`` must be plain (literals, the method's parameters, ``self.``
reads, enum members, ``torch.device(...)``): a call, a subscript, a local or
a member read out of another object (``self.w = ctx.weight``,
``self.m = blocks["a"]``) may be a parameter or a module. Round 26: a
class the index does not know, defined once in a file the pre-filter
skipped (no allocation written there: ``SwapAlign2Nat(2).to(device)``), is
read from that file's text: its only base ``nn.Module``, no decorator, its
class body only methods and literal constants, and no method registering
anything, handing ``self`` to a call, or storing on ``self`` a value that
is not plain. Round 33: a listed torch class keeps what it is given as
plain attributes, never as a parameter or buffer, so its arguments need not
be plain (``nn.Dropout(p).cuda()``, ``nn.Upsample(scale_factor=s)``), but a
weighted loss's (``CrossEntropyLoss``, ``NLLLoss``, ``BCELoss``,
``BCEWithLogitsLoss``...): its first positional, ``weight=`` and
``pos_weight=`` are a buffer (``nn.CrossEntropyLoss(w).to(d)`` stays a weight
upload; ``nn.NLLLoss(ignore_index=i)`` moves nothing). A project module's
``self.x = nn.NLLLoss()`` made so is no tensor it keeps (``_stateless_member``):
``WMDetectionLoss`` holding ``self.criterion = nn.NLLLoss()`` and numbers
moves nothing; one holding ``nn.CrossEntropyLoss(weight=w)`` or
``nn.LayerNorm(d)`` stays a site. Pure, but for ``skipped``'s reads.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence

from ..arglists import split_args
from ..model import Call, Site
from .index import ClassInfo, Func, ProjectIndex
from .module_classes import Skipped, receiver_builder
from .move_apis import MODULE_MOVES, without_moves

_TORCH_MODULE = frozenset({"nn.Module", "torch.nn.Module", "Module"})
_LITERAL = re.compile(r"None|True|False|-?[\d.]+(?:e-?\d+)?|[rbf]?[\"'][^\"']*[\"']|[A-Z]\w*(?:\.[A-Za-z_]\w*)+")
_REGISTERS = re.compile(r"(?:^|\.)(?:register_\w+|add_module|Parameter|setattr)$")


def drop_stateless_moves(sites: Sequence[Site], index: ProjectIndex, stateless: frozenset[str] = frozenset(),
                         skipped: Skipped | None = None) -> list[Site]:
    memo: dict[str, bool] = {}
    return without_moves(sites, MODULE_MOVES, lambda s: _moves_nothing(s, index, memo, stateless, skipped))


def _moves_nothing(site: Site, index: ProjectIndex, memo: dict[str, bool], stateless: frozenset[str],
                   skipped: Skipped | None) -> bool:
    func = index.func(site.path, site.scope)
    call = receiver_builder(func, site) if func is not None else None
    if func is None or call is None:
        return False
    cls = index.constructed_class(func, call)
    if cls is None:
        if _torch_stateless(call.callee, func, index, stateless):
            # round 33: a listed torch class keeps its arguments as plain attributes, never as a parameter or
            # buffer (`nn.Dropout(p)`, `nn.Upsample(scale_factor=s)`), but a weighted loss's weight slot
            return _unweighted(call.callee, call.arglist) \
                or all(_plain_argument(a.text.strip(), func, index) for a in split_args(call.arglist))
        return skipped is not None and _skipped_stateless(call.callee, func, index, skipped, memo) and \
            all(_plain_argument(a.text.strip(), func, index) for a in split_args(call.arglist))
    holds = memo.get(cls.key)
    if holds is None:
        holds = memo[cls.key] = _holds_nothing(cls, lambda c, f: _stateless_member(c, f, index, stateless)) \
            and index.class_allocates(cls) is None
    if not holds:
        return False
    args = [a.text.strip() for a in split_args(call.arglist)]
    plain = [_plain_argument(a, func, index) for a in args]
    if all(plain):
        return True
    # a plain object handed in is kept as a plain attribute (what is read out of it onto self is no plain value)
    return all(p or _plain_object(a, func, index, site.span.line) for a, p in zip(args, plain))


def _torch_stateless(callee: str, func: Func, index: ProjectIndex, stateless: frozenset[str]) -> bool:
    """``nn.L1Loss``, ``torch.nn.ReLU``, or ``L1Loss`` imported from ``torch.nn``: a listed torch class."""
    head, _, name = callee.rpartition(".")
    if name not in stateless:
        return False
    if not head:
        head = (index.imported(func.path, name) or "").rpartition(".")[0]
    return head in ("nn", "torch.nn", "torch.nn.modules.loss", "torch.nn.modules.activation")


# torch losses that register their class weights as a buffer: `weight` (the first positional) and `pos_weight`
_WEIGHTED = frozenset({"CrossEntropyLoss", "NLLLoss", "NLLLoss2d", "BCELoss", "BCEWithLogitsLoss", "MultiMarginLoss",
                       "MultiLabelSoftMarginLoss", "AdaptiveLogSoftmaxWithLoss"})


def _unweighted(callee: str, arglist: str) -> bool:
    """Round 33: the construction of a listed torch class registers nothing whatever its arguments: a class
    other than a weighted loss, or a weighted loss given no positional argument, no ``weight=``/``pos_weight=``
    but ``None``, and no ``**`` spread."""
    if callee.rpartition(".")[2] not in _WEIGHTED:
        return True
    for arg in split_args(arglist):
        if arg.keyword is None:
            return False  # a positional (the weight slot), a spread
        if arg.keyword in ("weight", "pos_weight") and arg.text.strip() != "None":
            return False
    return True


def _stateless_member(call: Call, func: Func | None, index: ProjectIndex, stateless: frozenset[str]) -> bool:
    """Round 33: a store ``self.x = nn.NLLLoss()`` of a project module: a listed torch class built so that it
    registers nothing (``_unweighted``) keeps no tensor the module's move copies."""
    return func is not None and _torch_stateless(call.callee, func, index, stateless) \
        and _unweighted(call.callee, call.arglist)


def _skipped_stateless(callee: str, func: Func, index: ProjectIndex, skipped: Skipped,
                       memo: dict[str, bool]) -> bool:
    """``callee`` names a class the index does not know, defined once in the skipped files that mention it,
    that keeps no tensor (``_class_holds_nothing``)."""
    name = callee.rpartition(".")[2]
    if not name[:1].isupper() or callee.startswith(("torch.", "nn.")) or index.resolve(func, callee) \
            or index.classes_named(name):
        return False
    key = "skipped:" + name
    if key not in memo:
        found: list[ast.ClassDef] = []
        readable = True
        for data in skipped(name):
            try:
                tree = ast.parse(data)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                readable = False  # a definition there is not read: proves nothing
                break
            found += [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
        memo[key] = readable and len(found) == 1 and _class_holds_nothing(found[0])
    return memo[key]


def _class_holds_nothing(cls: ast.ClassDef) -> bool:
    """A class read from its text keeps no tensor: its only base ``nn.Module``, no decorator or keyword, a
    body of methods and literal constants, and no method that registers anything, hands ``self`` to a call
    (but ``super(C, self)``) or stores on ``self`` a value that is not plain (``_plain_value``)."""
    if cls.decorator_list or cls.keywords or len(cls.bases) != 1 or ast.unparse(cls.bases[0]) not in _TORCH_MODULE:
        return False
    methods = []
    for statement in cls.body:
        if isinstance(statement, ast.FunctionDef):
            methods.append(statement)
        elif not (isinstance(statement, ast.Expr | ast.Assign | ast.AnnAssign | ast.Pass)
                  and isinstance(getattr(statement, "value", None), ast.Constant | None)):
            return False  # a class attribute made by a call, a nested class: not read
    if not methods:
        return False
    for method in methods:
        params = {a.arg for a in (*method.args.posonlyargs, *method.args.args, *method.args.kwonlyargs)}
        for node in ast.walk(method):
            if isinstance(node, ast.Call):
                if _REGISTERS.search(ast.unparse(node.func)) is not None:
                    return False
                passed = [*node.args, *(k.value for k in node.keywords)]
                if not (isinstance(node.func, ast.Name) and node.func.id == "super") \
                        and any(isinstance(a, ast.Name) and a.id == "self" for a in passed):
                    return False  # `init(self)`: the callee may register on it
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
            stored = [t for target in targets for t in ast.walk(target)
                      if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"]
            value = getattr(node, "value", None)
            if stored and (value is None or not _plain_value(ast.unparse(value), params)):
                return False
            if isinstance(node, ast.Attribute) and node.attr == "__dict__":
                return False
    return True


def _holds_nothing(cls: ClassInfo, stateless: Callable[[Call, Func], bool] | None = None) -> bool:
    """The class keeps no tensor: its only base is ``nn.Module`` and no
    method allocates, registers, or stores a call's value on ``self`` (round 33: but the construction of a
    torch class that registers nothing, ``stateless``: ``self.criterion = nn.NLLLoss()``)."""
    if len(cls.bases) != 1 or cls.bases[0].strip() not in _TORCH_MODULE or not cls.methods:
        return False
    for methods in cls.methods.values():
        for method in methods:
            quiet = {(c.span.line, (c.target or "").strip()) for c in method.calls
                     if stateless is not None and _SELF_ATTRIBUTE.fullmatch((c.target or "").strip())
                     and stateless(c, method)}
            if any(s.kept not in _GONE for s in method.sites) or any(
                    _keeps(c) and (c.span.line, (c.target or "").strip()) not in quiet for c in method.calls):
                return False
            params = set(method.scope.params) if method.scope is not None else set()
            if any(_SELF_ATTRIBUTE.fullmatch(t.strip()) and not _plain_value(a.value, params)
                   and not (len(a.targets) == 1 and (a.line, t.strip()) in quiet)
                   for a in method.assigns for t in a.targets):
                return False
    return True


# where an allocation of a method goes when the module does not keep it: returned, or a temporary
_GONE = frozenset({"return", "local"})
# `self.x`: a direct attribute, where a module registers a parameter, buffer or sub-module
_SELF_ATTRIBUTE = re.compile(r"self\.[A-Za-z_]\w*")
# calls whose value holds no tensor (`self._device = torch.device("cpu")`)
_NO_TENSOR = re.compile(r"torch\.device\([^()]*\)")


_WORDS = re.compile(r"[rbf]?\"[^\"]*\"|[rbf]?'[^']*'|\d[\w.]*|[A-Za-z_][\w.]*")
_KEYWORDS = frozenset({"None", "True", "False", "not", "and", "or", "is", "in", "if", "else"})
# round 35b: a class read off a module, not called (`tdist.normal.Normal`): a CamelCase name after
# lower-case module names holds no tensor (an ALL_CAPS constant, `consts.WEIGHT`, may be one)
_CLASS_OF_MODULE = re.compile(r"[a-z_]\w*(?:\.[a-z_]\w*)*\.[A-Z]+[a-z]\w*")


def _plain_value(value: str, params: set[str]) -> bool:
    """A value stored on ``self`` that cannot be a parameter, buffer or
    module: made of literals, the method's parameters (the construction's
    arguments, told apart by ``_plain_argument``), ``self.`` reads, enum
    members and ``torch.device(...)``; no call, subscript or other name. Round 35b: a
    class read off a module (``self.dist = tdist.normal.Normal``, never called here) too."""
    v = _NO_TENSOR.sub("", value.strip())
    for word in _WORDS.findall(v):
        if word[0] in "\"'0123456789" or word[-1] in "\"'" or word in _KEYWORDS or word in params \
                or word.startswith("self.") or re.fullmatch(r"[A-Z]\w*(?:\.\w+)+", word) \
                or _CLASS_OF_MODULE.fullmatch(word):
            continue
        return False
    stripped = _WORDS.sub("", v)
    return "(" not in stripped and "[" not in stripped


def _keeps(call: Call) -> bool:
    if _REGISTERS.search(call.callee) is not None:
        return True
    target = (call.target or "").strip()
    return _SELF_ATTRIBUTE.fullmatch(target) is not None and call.callee != "torch.device"


def _literal_local(name: str, func: Func) -> bool:
    """A local every assignment of which binds a literal (`h, w = (5, 5)`,
    `n = 4`) and no call's value."""
    if not name.isidentifier() or any((c.target or "").strip() == name for c in func.calls):
        return False
    found = False
    for a in func.assigns:
        targets = [t.strip() for t in ",".join(a.targets).strip("()[] ").split(",")]
        if name not in targets:
            continue
        if a.op != "=":
            return False
        value = a.value.strip()
        values = [v.strip() for v in value.strip("()[]").split(",")] if len(targets) > 1 else [value]
        if not all(_LITERAL.fullmatch(v) for v in values if v):
            return False
        found = True
    return found


def _plain_object(text: str, func: Func, index: ProjectIndex, line: int) -> bool:
    """``text`` is a local every binding of which above ``line`` constructs a
    project class with no base (not a module, not a tensor)."""
    if not text.isidentifier() or (func.scope is not None and text in func.scope.params):
        return False
    built = [c for c in func.calls if (c.target or "").strip() == text and c.span.line < line]
    if not built or any(text in a.targets or any(t.strip() == text for t in a.targets) for a in func.assigns):
        return False  # no construction, or a binding that is not a whole call
    for call in built:
        cls = index.constructed_class(func, call)
        if cls is None or any(b.strip() not in ("object", "") for b in cls.bases):
            return False
    return True


def _plain_argument(text: str, func: Func, index: ProjectIndex) -> bool:
    """An argument the object could not keep memory through: a literal,
    ``None``, ``Enum.member``, a name that resolves to project functions only
    or, unresolved, one the function binds by no assignment (an import)."""
    value = text.split("=", 1)[1].strip() if re.match(r"[A-Za-z_]\w*\s*=[^=]", text) else text
    if _LITERAL.fullmatch(value) is not None:
        return True
    if value[:1] in "([" and value[-1:] in ")]" and "(" not in value[1:-1] and "[" not in value[1:-1]:
        # a tuple or list of plain values (`(pool_h, pool_w)`)
        items = [i.strip() for i in value[1:-1].split(",") if i.strip()]
        return bool(items) and all(_plain_argument(i, func, index) or _literal_local(i, func) for i in items)
    if not value.isidentifier() or (func.scope is not None and value in func.scope.params):
        return False
    found = index.resolve(func, value)
    if found:
        return all(f.scope is not None and f.scope.role == "function" for f in found)
    # no local binds it (an import or a global of the file): no tensor made here
    return not any(value in a.targets for a in func.assigns) and not any(
        (c.target or "").strip() == value for c in func.calls)
