"""Shared analysis for the rules: path-sensitive reach (issue 16).

What a call edge passes for each parameter of the function it calls (a
literal, ``None``, something that is not ``None``, a parameter forwarded from
the caller, or unknown), and which branches of the callee that decides:
``if out is None:`` is dead when the caller passes ``out=buf``, ``if
use_fallback:`` is dead when the keyword default ``False`` applies, ``if m >
64:`` is dead for ``m=16``, ``if USE_SPLIT:`` is dead when the module sets the
constant ``False`` once. An unknown value keeps every branch (sound): only a
value the call states can prune.

Input: the index and a function with the values its parameters have;
output: the allocation sites it executes within ``depth`` calls, each with
its witness path (the calls, file:line per hop) and the branch conditions
assumed along it. Pure; results are memoised per (function, values, depth).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from dataclasses import dataclass
from functools import lru_cache

from ...arglists import split_args
from ...pipeline.index import Func, Hop, ProjectIndex
from ...model import Block, Call, Language, Related, Site, SiteKind, Span

# What a value is known to be.
LITERAL, NONE, NOT_NONE, UNKNOWN = "literal", "none", "not-none", "unknown"


@dataclass(frozen=True)
class Value:
    kind: str
    literal: object = None
    why: str = ""  # "the call passes 16", "default None"

    @property
    def known(self) -> bool:
        return self.kind != UNKNOWN


UNKNOWN_VALUE = Value(UNKNOWN)
Env = Mapping[str, Value]


@dataclass(frozen=True)
class Witness:
    """A site reached on a path whose branches the call edges allow."""

    site: Site
    hops: tuple[Hop, ...]
    assumptions: tuple[Related, ...]  # branch conditions taken along the path, file:line each


# ------------------------------------------------------------ values at an edge

_LITERAL_HEAD = re.compile(r"^[-+]?(?:\d|\.\d|True\b|False\b|None\b|['\"])")
# expressions that are never None: tensors made or viewed, arithmetic, displays
_NOT_NONE_CALL = re.compile(r"^(?:torch|at|np|numpy)\.\w|\.(?:view|reshape|flatten|narrow|contiguous|to|cuda|"
                            r"clone|expand|select|slice|unsqueeze|squeeze|transpose|permute|new_\w+)\(")


def module_constants(index: ProjectIndex, path: str) -> dict[str, Value]:
    """Names a Python module assigns exactly once, at module level, to a
    literal (``USE_SPLIT_K = False``), and never rebinds in a function."""
    found: dict[str, Value] = {}
    module = index.func(path, "<module>")
    if module is None or module.language is not Language.PYTHON:
        return found
    counts: dict[str, int] = {}
    for assign in module.assigns:
        for target in assign.targets:
            counts[target] = counts.get(target, 0) + 1
    rebound = {t for f in index.functions_in(path) if f is not module for a in f.assigns for t in a.targets}
    for assign in module.assigns:
        if len(assign.targets) != 1 or assign.op != "=":
            continue
        name = assign.targets[0]
        if counts.get(name) != 1 or name in rebound or not name.isidentifier():
            continue
        value = _literal(assign.value, f"module constant {name} = {assign.value.strip()}")
        if value is not None:
            found[name] = value
    return found


def _literal(text: str, why: str) -> Value | None:
    text = text.strip()
    if not text or not _LITERAL_HEAD.match(text):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if value is None:
        return Value(NONE, None, why)
    return Value(LITERAL, value, why)


def value_of(func: Func, text: str, env: Env, constants: Env, why: str) -> Value:
    """What an argument expression in ``func`` is known to be."""
    text = text.strip()
    found = _literal(text, why)
    if found is not None:
        return found
    if text.isidentifier():
        if text in env:
            inner = env[text]
            if not inner.known:
                return UNKNOWN_VALUE
            return Value(inner.kind, inner.literal, f"{why}, forwarded from {inner.why}")
        constant = constants.get(text)
        if constant is not None:
            return constant
        return _local_value(func, text, why)
    if text.startswith(("[", "{", "f\"", "f'", "lambda ")) or _NOT_NONE_CALL.search(text):
        return Value(NOT_NONE, None, why)
    return UNKNOWN_VALUE


def _local_value(func: Func, name: str, why: str) -> Value:
    """A local whose every assignment in the function is an allocation (a
    site's target) is not None: the caller hands over a buffer it made."""
    if func.scope is not None and name in func.scope.params:
        return UNKNOWN_VALUE
    made = any(s.target == name for s in func.sites if s.kind is not SiteKind.RELEASE)
    if not made:
        return UNKNOWN_VALUE
    for assign in func.assigns:
        if name in assign.targets and _literal(assign.value, "") is not None and assign.value.strip() == "None":
            return UNKNOWN_VALUE
        if name in assign.targets and not _NOT_NONE_CALL.search(assign.value):
            return UNKNOWN_VALUE
    return Value(NOT_NONE, None, f"{why} (a buffer {func.qualname} allocates)")


def bind_edge(caller: Func, call: Call, target: Func, env: Env, constants: Env) -> dict[str, Value]:
    """The values the call gives the target's parameters. Parameters the call
    leaves out take their default; a ``*args``/``**kwargs`` at the call makes
    every parameter it could fill unknown (sound)."""
    scope = target.scope
    if scope is None or (target.language is Language.PYTHON) != (caller.language is Language.PYTHON):
        return {}
    if target.language is not Language.PYTHON:
        return _bind_native(caller, call, scope.params, env)
    params = list(scope.params)
    defaults = list(scope.param_defaults) or [""] * len(params)
    if params and params[0] in ("self", "cls") and "staticmethod" not in scope.decorators:
        params, defaults = params[1:], defaults[1:]
    args = split_args(call.arglist)
    if any(a.keyword is None and a.text.startswith("*") for a in args):
        return {}
    spread = any(a.keyword is None and a.text.startswith("**") for a in args) or \
        any((a.keyword or "").startswith("**") for a in args)
    out: dict[str, Value] = {}
    positional = [a for a in args if a.keyword is None]
    keywords = {a.keyword: a for a in args if a.keyword is not None}
    where = f"{caller.path}:{call.span.line}"
    i = 0
    for name, default in zip(params, defaults):
        if name.startswith("*"):
            break
        if i < len(positional):
            out[name] = value_of(caller, positional[i].text, env, constants, f"{where} passes {positional[i].text}")
            i += 1
        elif name in keywords:
            text = keywords[name].text
            out[name] = value_of(caller, text, env, constants, f"{where} passes {name}={text}")
        elif spread:
            out[name] = UNKNOWN_VALUE
        elif default:
            value = _literal(default, f"{where} passes no {name} (default {default})")
            out[name] = value if value is not None else UNKNOWN_VALUE
    for name, default in zip(params, defaults):
        if name in keywords and name not in out:
            out[name] = value_of(caller, keywords[name].text, env, constants, f"{where} passes {name}=...")
    return {k: v for k, v in out.items() if v.known}


_NATIVE_INT = re.compile(r"^[-+]?\d+[uUlL]*$")


def _bind_native(caller: Func, call: Call, params: tuple[str, ...], env: Env) -> dict[str, Value]:
    """C++/CUDA edges: positional arguments only (default arguments live in
    declarations, which are not read: a parameter the call leaves out is
    unknown). ``nullptr``/``NULL``/``0`` for a pointer, ``true``/``false``,
    integer literals, ``&x`` (never null) and forwarded parameters are known."""
    out: dict[str, Value] = {}
    where = f"{caller.path}:{call.span.line}"
    args = split_args(call.arglist, True)
    for name, arg in zip(params, args):
        text = arg.text.strip()
        why = f"{where} passes {text}"
        name = name.lstrip("*&")
        if text in ("nullptr", "NULL"):
            out[name] = Value(NONE, None, why)
        elif text in ("true", "false"):
            out[name] = Value(LITERAL, text == "true", why)
        elif _NATIVE_INT.match(text):
            out[name] = Value(LITERAL, int(text.rstrip("uUlL")), why)
        elif re.fullmatch(r"&\s*[A-Za-z_][\w.>-]*", text):
            out[name] = Value(LITERAL, True, f"{why} (an address, never null)")
        elif text.isidentifier() and text in env and env[text].known:
            inner = env[text]
            out[name] = Value(inner.kind, inner.literal, f"{why}, forwarded from {inner.why}")
    return out


_CPP_TOKENS = ((re.compile(r"&&"), " and "), (re.compile(r"\|\|"), " or "), (re.compile(r"!(?!=)"), " not "),
               (re.compile(r"\b(?:nullptr|NULL)\b"), "None"), (re.compile(r"\btrue\b"), "True"),
               (re.compile(r"\bfalse\b"), "False"))


def pythonize_native(test: str) -> str:
    """A C++ condition in Python's syntax, for the small language ``decide``
    reads (`!ws || ws == nullptr` -> `not ws or ws is None`); anything with
    member access, casts or calls stays unparsable, so it is not decided."""
    if any(t in test for t in ("->", "::", "<<", ">>", "?")):
        return ""
    out = test
    for pattern, repl in _CPP_TOKENS:
        out = pattern.sub(repl, out)
    out = re.sub(r"\b([A-Za-z_]\w*)\s*==\s*None\b", r"\1 is None", out)
    out = re.sub(r"\b([A-Za-z_]\w*)\s*!=\s*None\b", r"\1 is not None", out)
    return out


# ------------------------------------------------------------ deciding conditions


def decide(test: str, env: Env, constants: Env) -> bool | None:
    """True/False when the condition is decided by the known values, None
    when it is not (the path is then kept)."""
    parsed = _parse_test(test)
    if parsed is None:
        return None
    node, names = parsed
    if not any(n in env or n in constants for n in names) and not isinstance(node, ast.Constant):
        return None
    return _truth(node, env, constants)


@lru_cache(maxsize=65536)
def _parse_test(test: str) -> tuple[ast.expr, frozenset[str]] | None:
    """A condition's expression and the plain names it reads, parsed once."""
    if not test:
        return None
    try:
        node = ast.parse(test.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return node, frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))


_UNSET = object()


def _operand(node: ast.AST, env: Env, constants: Env) -> object:
    """The known Python value of an operand, or _UNSET."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        value = env.get(node.id) or constants.get(node.id)
        if value is not None and value.kind in (LITERAL, NONE):
            return value.literal
        return _UNSET
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _operand(node.operand, env, constants)
        return -inner if isinstance(inner, (int, float)) and not isinstance(inner, bool) else _UNSET
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
        left, right = _operand(node.left, env, constants), _operand(node.right, env, constants)
        if isinstance(left, int) and isinstance(right, int) and not isinstance(left, bool) \
                and not isinstance(right, bool):
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            return left // right if right else _UNSET
    return _UNSET


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}


def _truth(node: ast.AST, env: Env, constants: Env) -> bool | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _truth(node.operand, env, constants)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        values = [_truth(v, env, constants) for v in node.values]
        if isinstance(node.op, ast.And):
            if any(v is False for v in values):
                return False
            return True if all(v is True for v in values) else None
        if any(v is True for v in values):
            return True
        return False if all(v is False for v in values) else None
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        op, right = node.ops[0], node.comparators[0]
        if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) and right.value is None \
                and isinstance(node.left, ast.Name):
            value = env.get(node.left.id) or constants.get(node.left.id)
            if value is None or value.kind == UNKNOWN:
                return None
            is_none = value.kind == NONE
            return is_none if isinstance(op, ast.Is) else not is_none
        compare = _COMPARE.get(type(op))
        if compare is not None:
            left, right_value = _operand(node.left, env, constants), _operand(right, env, constants)
            if left is not _UNSET and right_value is not _UNSET:
                try:
                    return bool(compare(left, right_value))
                except TypeError:
                    return None
        return None
    if isinstance(node, ast.Name):
        value = env.get(node.id) or constants.get(node.id)
        if value is None or value.kind in (UNKNOWN, NOT_NONE):
            return None
        return bool(value.literal)
    if isinstance(node, ast.Constant):
        return bool(node.value)
    return None


@dataclass(frozen=True)
class PathCheck:
    """Whether a span of a function runs under the known values; when it
    can, the conditions it assumes."""

    live: bool
    assumed: tuple[tuple[int, str, bool | None], ...] = ()  # (line, condition, decided value)


def _siblings(func: Func, block: Block) -> list[Block]:
    """The if/elif branches before ``block`` in the same statement."""
    return [b for b in func.blocks if b.stmt == block.stmt and b.kind in ("if", "elif")
            and (b.span.line, b.span.col) < (block.span.line, block.span.col)]


class _Blocks:
    """A function's branch structure, computed once: the blocks, and for
    each guard clause (an ``if`` whose body leaves the function) the
    blocks that hold it, so a span is after a guard at its own level."""

    __slots__ = ("blocks", "guards")

    def __init__(self, func: Func) -> None:
        self.blocks = func.blocks
        self.guards: list[tuple[Block, tuple[Block, ...]]] = []
        for block in self.blocks:
            if block.exits and block.kind == "if" and block.stmt is not None:
                stmt = block.stmt
                self.guards.append((block, tuple(b for b in self.blocks if b.span.contains(stmt))))


def check_span(func: Func, span: Span, env: Env, constants: Env, structure: _Blocks | None = None) -> PathCheck:
    if not func.blocks:
        return PathCheck(True)
    if func.language is not Language.PYTHON:
        if not env:
            return PathCheck(True)  # nothing known about a native function's parameters: every path runs
        return _check_native(func, span, env, structure or _Blocks(func))
    structure = structure or _Blocks(func)
    assumed: list[tuple[int, str, bool | None]] = []
    enclosing = [b for b in structure.blocks if b.span.contains(span)]
    for block in enclosing:
        if block.kind == "if" or block.kind == "elif":
            for sibling in _siblings(func, block) if block.kind == "elif" else ():
                value = decide(sibling.test, env, constants)
                if value is True:
                    return PathCheck(False)
                assumed.append((sibling.span.line, f"not ({sibling.test})", None if value is None else True))
            value = decide(block.test, env, constants)
            if value is False:
                return PathCheck(False)
            assumed.append((block.span.line, block.test, value))
        elif block.kind == "else" and block.stmt is not None:
            branches = [b for b in structure.blocks if b.stmt == block.stmt and b.kind in ("if", "elif")]
            for sibling in branches:
                value = decide(sibling.test, env, constants)
                if value is True:
                    return PathCheck(False)
                assumed.append((sibling.span.line, f"not ({sibling.test})", None if value is None else True))
        elif block.kind == "while":
            if decide(block.test, env, constants) is False:
                return PathCheck(False)
    # guard clauses before the span at its own level: `if out is not None: return`
    for block, holders in structure.guards:
        stmt = block.stmt
        assert stmt is not None
        if stmt.end_line >= span.line or stmt.contains(span) or not all(h in enclosing for h in holders):
            continue
        value = decide(block.test, env, constants)
        if value is True:
            return PathCheck(False)
        if value is False:
            assumed.append((block.span.line, f"not ({block.test})", True))
    return PathCheck(True, tuple(assumed))


def _check_native(func: Func, span: Span, env: Env, structure: _Blocks) -> PathCheck:
    """``check_span`` for C++/CUDA: ``if``/``else`` branches and guard
    clauses decided by what the edge passes, conditions read through
    ``pythonize_native``."""
    assumed: list[tuple[int, str, bool | None]] = []
    enclosing = [b for b in structure.blocks if b.span.contains(span)]
    for block in enclosing:
        if block.kind in ("if", "elif"):
            value = decide(pythonize_native(block.test), env, {})
            if value is False:
                return PathCheck(False)
            assumed.append((block.span.line, block.test, value))
        elif block.kind == "else" and block.stmt is not None:
            for sibling in (b for b in structure.blocks if b.stmt == block.stmt and b.kind in ("if", "elif")):
                value = decide(pythonize_native(sibling.test), env, {})
                if value is True:
                    return PathCheck(False)
                assumed.append((sibling.span.line, f"!{sibling.test}", None if value is None else True))
    for block, holders in structure.guards:
        stmt = block.stmt
        assert stmt is not None
        if stmt.end_line >= span.line or stmt.contains(span) or not all(h in enclosing for h in holders):
            continue
        if decide(pythonize_native(block.test), env, {}) is True:
            return PathCheck(False)
    return PathCheck(True, tuple(a for a in assumed if a[2] is not None or any(
        re.search(rf"\b{re.escape(k)}\b", a[1]) for k in env)))


# ------------------------------------------------------------ reach


def _env_key(env: Env) -> tuple[tuple[str, str, str], ...]:
    return tuple(sorted((k, v.kind, repr(v.literal)) for k, v in env.items()))


class PathReach:
    """Path-sensitive reach over one index, memoised across the rule's
    regions: (function, known values, depth) -> witnesses."""

    def __init__(self, index: ProjectIndex) -> None:
        self.index = index
        self._memo: dict[tuple[str, tuple[tuple[str, str, str], ...], int], tuple[Witness, ...]] = {}
        self._constants: dict[str, dict[str, Value]] = {}
        self._blocks: dict[str, _Blocks] = {}

    def structure(self, func: Func) -> _Blocks:
        found = self._blocks.get(func.id)
        if found is None:
            found = self._blocks[func.id] = _Blocks(func)
        return found

    def constants(self, func: Func) -> Env:
        found = self._constants.get(func.path)
        if found is None:
            found = self._constants[func.path] = module_constants(self.index, func.path)
        return found

    def live_calls(self, func: Func, calls: Iterable[Call], env: Env) -> Iterator[tuple[Call, PathCheck]]:
        constants = self.constants(func)
        structure = self.structure(func)
        for call in calls:
            verdict = check_span(func, call.span, env, constants, structure)
            if verdict.live:
                yield call, verdict

    def from_call(self, func: Func, call: Call, env: Env, depth: int) -> Iterator[tuple[Func, Witness]]:
        """Sites reached through one call of ``func`` (each target, then its
        callees up to ``depth`` more calls)."""
        for target in self.index.resolve(func, call):
            bound = bind_edge(func, call, target, env, self.constants(func))
            hop = Hop(call, func.path, func.qualname, target.qualname)
            for witness in self.reach(target, bound, depth):
                # say what the call passed only where it decided a branch on the path
                said = " ".join(r.note for r in witness.assumptions)
                notes = tuple(Related(target.path, target.span.line if target.span else 0, f"{name} = {_shown(v)}: {v.why}")
                              for name, v in sorted(bound.items()) if v.why and re.search(rf"\b{name}\b", said))
                yield target, Witness(witness.site, (hop, *witness.hops), notes + witness.assumptions)

    def reach(self, func: Func, env: Env, depth: int) -> tuple[Witness, ...]:
        key = (func.id, _env_key(env), depth)
        found = self._memo.get(key)
        if found is not None:
            return found
        self._memo[key] = ()  # cycle guard
        constants = self.constants(func)
        out: dict[tuple[str, int, int], Witness] = {}
        for site in func.sites:
            if on_host(func, site, env, constants):
                continue
            verdict = check_span(func, site.span, env, constants, self.structure(func))
            if verdict.live:
                out[(site.path, site.span.line, site.span.col)] = Witness(site, (), _notes(func, verdict))
        if depth > 0:
            for call, verdict in self.live_calls(func, func.calls, env):
                for _target, witness in self.from_call(func, call, env, depth - 1):
                    skey = (witness.site.path, witness.site.span.line, witness.site.span.col)
                    if skey in out and len(out[skey].hops) <= len(witness.hops):
                        continue
                    out[skey] = Witness(witness.site, witness.hops, _notes(func, verdict) + witness.assumptions)
        result = tuple(sorted(out.values(), key=lambda w: (len(w.hops), w.site.sort_key)))
        self._memo[key] = result
        return result


def on_host(func: Func, site: Site, env: Env, constants: Env) -> bool:
    """A tensor whose ``device=`` is a name that holds a literal ``"cpu"`` on
    this path (a parameter bound or defaulted to it, a module constant, a
    local assigned only that literal) is host memory, not a device site."""
    if site.device not in (None, "unknown") or site.language is not Language.PYTHON:
        return False
    device = _device_argument(func, site)
    if not device.isidentifier():
        return False
    value = env.get(device) or constants.get(device)
    if value is None:
        texts = [a.value.strip() for a in func.assigns if device in a.targets]
        if not texts or func.scope is not None and device in func.scope.params:
            return False
        values = [_literal(t, "") for t in texts]
        return all(v is not None and isinstance(v.literal, str) and v.literal.startswith("cpu") for v in values)
    return value.kind == LITERAL and isinstance(value.literal, str) and value.literal.startswith("cpu")


def _device_argument(func: Func, site: Site) -> str:
    """The source text of the site call's ``device=`` argument, or ""."""
    for call in func.calls:
        if call.span.line == site.span.line and call.span.col == site.span.col and "device" in call.arglist:
            for arg in split_args(call.arglist):
                if arg.keyword == "device":
                    return arg.text.strip()
    return ""


def _shown(value: Value) -> str:
    if value.kind == NONE:
        return "None"
    if value.kind == NOT_NONE:
        return "not None"
    return repr(value.literal)


def _notes(func: Func, verdict: PathCheck) -> tuple[Related, ...]:
    out = []
    for line, condition, value in verdict.assumed:
        how = "holds" if value is True else "assumed (not decided by the call)"
        out.append(Related(func.path, line, f"branch `{condition}` {how}"))
    return tuple(out)
