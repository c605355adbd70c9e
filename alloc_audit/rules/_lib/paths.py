"""Shared analysis for the rules: path-sensitive reach (issue 16).

The index says what a call edge passes for each parameter of the function
it calls (``ProjectIndex.edge_values``: a literal, ``None``, something that
is not ``None``, a parameter forwarded from the caller, or unknown); this
module decides which branches of the callee that allows:
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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ...arglists import split_args
from ...model import Block, Call, Language, Related, Site, Span
from ...pipeline.index import Func, Hop, ProjectIndex
from ...pipeline.index.values import LITERAL, NONE, NOT_NONE, UNKNOWN, Env, Value, literal_value, off_device


@dataclass(frozen=True)
class Witness:
    """A site reached on a path whose branches the call edges allow."""

    site: Site
    hops: tuple[Hop, ...]
    assumptions: tuple[Related, ...]  # branch conditions taken along the path, file:line each


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
    if not any(n in env or n in constants for n in names) and not isinstance(node, ast.Constant) \
            and CAPTURING not in constants:
        return None
    return _truth(node, env, constants)


# Under this key, a region's constants carry the capture checks (a name
# predicate): inside a capture, `torch.cuda.is_current_stream_capturing()` is true.
CAPTURING = "<capturing>"


@lru_cache(maxsize=65536)
def _parse_test(test: str) -> tuple[ast.expr, frozenset[str]] | None:
    """A condition's expression and the plain names it reads, parsed once."""
    if not test:
        return None
    try:
        node = ast.parse(test.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return node, frozenset(name for n in ast.walk(node) if (name := _name(n)))


def _name(node: ast.AST) -> str:
    """A plain name (`out`) or an attribute of ``self`` (`self.deterministic`:
    a known value when a constructor stores a parameter there), else ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return ""


_UNSET = object()


def _operand(node: ast.AST, env: Env, constants: Env) -> object:
    """The known Python value of an operand, or _UNSET."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)) and _name(node):
        value = env.get(_name(node)) or constants.get(_name(node))
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
                and _name(node.left):
            value = env.get(_name(node.left)) or constants.get(_name(node.left))
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
    if isinstance(node, (ast.Name, ast.Attribute)) and _name(node):
        value = env.get(_name(node)) or constants.get(_name(node))
        if value is None or value.kind in (UNKNOWN, NOT_NONE):
            return None
        return bool(value.literal)
    if isinstance(node, ast.Constant):
        return bool(node.value)
    if isinstance(node, ast.Call) and not node.args and CAPTURING in constants:
        checks = constants[CAPTURING].literal
        if callable(checks) and checks(ast.unparse(node.func)):
            return True
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
        elif block.kind == "while" and decide(block.test, env, constants) is False:
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


def env_key(env: Env) -> tuple[tuple[str, str, str], ...]:
    return tuple(sorted((k, v.kind, repr(v.literal)) for k, v in env.items()))


class PathReach:
    """Path-sensitive reach over one index, memoised across the rule's
    regions: (function, known values, depth) -> witnesses."""

    def __init__(self, index: ProjectIndex) -> None:
        self.index = index
        self._memo: dict[tuple[str, tuple[tuple[str, str, str], ...], int], tuple[Witness, ...]] = {}
        self._blocks: dict[str, _Blocks] = {}

    def structure(self, func: Func) -> _Blocks:
        found = self._blocks.get(func.id)
        if found is None:
            found = self._blocks[func.id] = _Blocks(func)
        return found

    def constants(self, func: Func) -> Env:
        return self.index.module_constants(func.path)

    def live_calls(self, func: Func, calls: Iterable[Call], env: Env,
                   constants: Env | None = None) -> Iterator[tuple[Call, PathCheck]]:
        constants = self.constants(func) if constants is None else constants
        structure = self.structure(func)
        for call in calls:
            verdict = check_span(func, call.span, env, constants, structure)
            if verdict.live:
                yield call, verdict

    def from_call(self, func: Func, call: Call, env: Env, depth: int) -> Iterator[tuple[Func, Witness]]:
        """Sites reached through one call of ``func`` (each target, then its
        callees up to ``depth`` more calls)."""
        for target in self.index.resolve(func, call):
            bound = self.index.edge_values(func, call, target, env)
            hop = Hop(call, func.path, func.qualname, target.qualname)
            for witness in self.reach(target, bound, depth):
                # say what the call passed only where it decided a branch on the path
                said = " ".join(r.note for r in witness.assumptions)
                line = target.span.line if target.span else 0
                notes = tuple(Related(target.path, line, f"{name} = {_shown(v)}: {v.why}")
                              for name, v in sorted(bound.items()) if v.why and re.search(rf"\b{name}\b", said))
                yield target, Witness(witness.site, (hop, *witness.hops), notes + witness.assumptions)

    def reach(self, func: Func, env: Env, depth: int) -> tuple[Witness, ...]:
        key = (func.id, env_key(env), depth)
        found = self._memo.get(key)
        if found is not None:
            return found
        self._memo[key] = ()  # cycle guard
        constants = self.constants(func)
        out: dict[tuple[str, int, int], Witness] = {}
        for site in func.sites:
            if on_host(func, site, env, constants) or untaken_choice(func, site, env, constants):
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
    """A tensor whose ``device=`` (or a move's `.to(device)`) is a name that
    holds a literal ``"cpu"`` on this path (a parameter bound or defaulted to
    it, a constructor's `self.device` stored from one, a module constant, a
    local assigned only that literal) is host memory, not a device site."""
    if site.device not in (None, "unknown") or site.language is not Language.PYTHON:
        return False
    device = _device_argument(func, site)
    if not _DEVICE_NAME.fullmatch(device):
        return False
    value = env.get(device) or constants.get(device)
    if value is None and not device.isidentifier():
        return False  # `self.device` not stored from the call: set anywhere
    if value is None:
        texts = [a.value.strip() for a in func.assigns if device in a.targets]
        if not texts or func.scope is not None and device in func.scope.params:
            return False
        values = [literal_value(t, "") for t in texts]
        return all(off_device(v) for v in values)
    return off_device(value)


def untaken_choice(func: Func, site: Site, env: Env, constants: Env) -> bool:
    """The site is the one branch of a conditional expression on its line,
    `m = m.cuda() if on_gpu else m.cpu()`, whose test this path decides
    against (only one branch calls the site's method)."""
    if site.language is not Language.PYTHON:
        return False
    method = site.api.rsplit(".", 1)[-1]
    for assign in func.assigns:
        if assign.line != site.span.line or " if " not in assign.value or " else " not in assign.value:
            continue
        try:
            node = ast.parse(assign.value.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        if not isinstance(node, ast.IfExp):
            return False
        calls = [any(isinstance(n, ast.Call) and (isinstance(n.func, ast.Attribute) and n.func.attr == method
                                                  or isinstance(n.func, ast.Name) and n.func.id == method)
                     for n in ast.walk(side)) for side in (node.body, node.orelse)]
        if calls[0] == calls[1]:
            return False
        value = decide(ast.unparse(node.test), env, constants)
        return value is (not calls[0])  # the site's branch is the other one
    return False


_DEVICE_NAME = re.compile(r"(?:self\.)?[A-Za-z_]\w*")


def _device_argument(func: Func, site: Site) -> str:
    """The source text of the site call's ``device=`` argument (a move's
    first argument), or ""."""
    moves = site.api in ("Tensor.to", "Module.to")
    for call in func.calls:
        if call.span.line != site.span.line or call.span.col != site.span.col:
            continue
        if moves and call.callee.rsplit(".", 1)[-1] == "to" and call.arglist.strip():
            args = split_args(call.arglist)
            first = next((a for a in args if a.keyword == "device"), args[0])
            return first.text.strip() if first.keyword in (None, "device") else ""
        if "device" in call.arglist:
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
