"""Stage 4, index, values: what a call edge passes for each parameter of the
function it calls (issue 16), and the literal constants a module defines.

A value is a literal, ``None``, something that is not ``None`` (a buffer the
caller allocates, an address in C++), a parameter forwarded from the caller
(carried through the caller's own known values), or unknown. Only what the
call states is known: a ``*args``/``**kwargs`` at the call, a value read from
object state or returned by a call, a default that is not a literal, and a
C++ parameter whose default only a separate declaration gives (declarations
are not read) are unknown, so the rules keep every branch they could take
(sound). Pure: facts in, values out; module constants memoised.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ...arglists import split_args
from ...model import Call, Language, Scope, SiteKind, Span
from .symbols import Func, Symbols

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


_LITERAL_HEAD = re.compile(r"^[-+]?(?:\d|\.\d|True\b|False\b|None\b|['\"])")
# expressions that are never None: tensors made or viewed, arithmetic, displays
_NOT_NONE_CALL = re.compile(r"^(?:torch|at|np|numpy)\.\w|\.(?:view|reshape|flatten|narrow|contiguous|to|cuda|"
                            r"clone|expand|select|slice|unsqueeze|squeeze|transpose|permute|new_\w+)\(")


_CPU_DEVICE = re.compile(r"""(?:torch\.)?device\(\s*(['"])(cpu|meta)(?::\d+)?\1\s*\)""")


def cpu_device_value(text: str, why: str) -> Value | None:
    """``torch.device("cpu")`` is known: the literal ``"cpu"`` (``torch.device("meta")``: ``"meta"``)."""
    m = _CPU_DEVICE.fullmatch(text.strip())
    return Value(LITERAL, m.group(2), why) if m else None


_OFF_ITEM = r"""(?:(?:torch\.)?device\(\s*)?(['"])(cpu|meta)(?::\d+)?\GROUP\s*\)?"""
_OFF_FIRST, _OFF_LAST = _OFF_ITEM.replace("GROUP", "1"), _OFF_ITEM.replace("GROUP", "3")
# `[torch.device("cpu"), torch.device("cpu")]`, `[torch.device("cpu")] * 2`, `["cpu" for _ in range(2)]`
_OFF_DISPLAY = re.compile(r"[\[(]\s*(?:" + _OFF_FIRST + r"\s*,\s*)*" + _OFF_LAST + r"\s*,?\s*[\])](?:\s*\*\s*\w+)?")
_OFF_COMPREHENSION = re.compile(r"[\[(]\s*" + _OFF_FIRST + r"\s+for\s+\w+\s+in\s+[^\[\]()]*(?:\([^()]*\))?\s*[\])]")


def cpu_devices_value(text: str, why: str) -> Value | None:
    """A list or tuple of CPU/meta devices (a display, its repetition, or a
    comprehension of one such literal): the tuple of their literals."""
    text = text.strip()
    if not text.startswith(("[", "(")) or ("cpu" not in text and "meta" not in text):
        return None
    if _OFF_DISPLAY.fullmatch(text) is None and _OFF_COMPREHENSION.fullmatch(text) is None:
        return None
    return Value(LITERAL, tuple(m.group(2) for m in re.finditer(r"""(['"])(cpu|meta)""", text)), why)


def off_devices(value: Value | None) -> bool:
    """A non-empty list or tuple of only CPU or ``meta`` device literals."""
    return value is not None and value.kind == LITERAL and isinstance(value.literal, (list, tuple)) and \
        bool(value.literal) and all(isinstance(d, str) and d.startswith(("cpu", "meta")) for d in value.literal)


def off_device(value: Value | None) -> bool:
    """A literal device where nothing is allocated on the GPU: the CPU or ``meta``."""
    return value is not None and value.kind == LITERAL and isinstance(value.literal, str) and \
        value.literal.startswith(("cpu", "meta"))


def module_constants(symbols: Symbols, path: str) -> dict[str, Value]:
    """Names a Python module assigns exactly once, at module level, to a
    literal (``USE_SPLIT_K = False``) or to the CPU device (``CPU =
    torch.device("cpu")``: the literal ``"cpu"``), and never rebinds in a
    function."""
    found: dict[str, Value] = {}
    module = symbols.func(path, "<module>")
    if module is None or module.language is not Language.PYTHON:
        return found
    counts: dict[str, int] = {}
    for assign in module.assigns:
        for target in assign.targets:
            counts[target] = counts.get(target, 0) + 1
    rebound = {t for f in symbols.by_path.get(path, {}).values() if f is not module for a in f.assigns
               for t in a.targets}
    # `global _pool` ... `_pool = make_pool()` in a function: a call's value, kept as the call's target
    rebound |= {t for f in symbols.by_path.get(path, {}).values() if f is not module and f.table is not None
                for i in f.call_ix if (t := f.table.targets[i])}
    for assign in module.assigns:
        if len(assign.targets) != 1 or assign.op != "=":
            continue
        name = assign.targets[0]
        if counts.get(name) != 1 or name in rebound or not name.isidentifier():
            continue
        value = literal_value(assign.value, f"module constant {name} = {assign.value.strip()}") \
            or _aliased_device(module, assign.value, counts, rebound, name)
        if value is not None:
            found[name] = value
    # a class body's `CPU = "cpu"` binds a class attribute, not the module's name
    in_functions = {t for f in symbols.by_path.get(path, {}).values() if _function(f)
                    for a in f.assigns for t in a.targets}
    return found | _cpu_devices(symbols, module, counts, in_functions)


def _aliased_device(module: Func, text: str, counts: Mapping[str, int], rebound: set[str], name: str) -> Value | None:
    """`CPU: Final = Device("cpu")` (an annotated binding, kept as an
    assignment) where the module binds `Device = torch.device` once: the CPU."""
    callee, paren, rest = text.strip().partition("(")
    if not paren or not callee.isidentifier() or counts.get(callee) != 1 or callee in rebound:
        return None
    if not any(a.targets == (callee,) and a.op == "=" and a.value.strip() == "torch.device" for a in module.assigns):
        return None
    return cpu_device_value(f"torch.device({rest}", f"module constant {name} = {text.strip()}")


def _function(func: Func) -> bool:
    """A function's body (a class body or the module level binds no local)."""
    return func.scope is not None and func.scope.kind != "class"


def _cpu_devices(symbols: Symbols, module: Func, counts: Mapping[str, int], rebound: set[str]) -> dict[str, Value]:
    """``CPU = torch.device("cpu")`` at module level (a call, recorded with
    its target), bound once and never rebound in a function."""
    table = module.table
    if table is None:
        return {}
    found: dict[str, Value] = {}
    targets = [table.targets[i] for i in module.call_ix]
    for i, target in zip(module.call_ix, targets):
        if not target or not target.isidentifier() or counts.get(target) or targets.count(target) != 1 \
                or target in rebound:
            continue
        text = f"{table.callees[i]}({table.arglists[i]})"
        value = cpu_device_value(text, f"module constant {target} = {text}")
        if value is not None:
            found[target] = value
    if found:  # rebound by a call in a function (`CPU = torch.device(dev)`): not a constant
        for f in symbols.by_path.get(module.path, {}).values():
            if _function(f) and f.table is not None:
                for i in f.call_ix:
                    found.pop(f.table.targets[i] or "", None)
    return found


def literal_value(text: str, why: str) -> Value | None:
    """A Python literal's value (``None``, numbers, strings, booleans)."""
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
    found = literal_value(text, why) or cpu_device_value(text, why) or cpu_devices_value(text, why)
    if found is not None:
        return found
    if text in env and not text.isidentifier():  # `x.device` the caller knows (off_device)
        return Value(env[text].kind, env[text].literal, f"{why}, {env[text].why}")
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
        if name in assign.targets and literal_value(assign.value, "") is not None and assign.value.strip() == "None":
            return UNKNOWN_VALUE
        if name in assign.targets and not _NOT_NONE_CALL.search(assign.value):
            return UNKNOWN_VALUE
    return Value(NOT_NONE, None, f"{why} (a buffer {func.qualname} allocates)")


def call_params(scope: Scope) -> tuple[list[str], list[str]]:
    """The parameters a call of a Python function fills, and their defaults
    ("" for none): a method's receiver (`self`, `cls`; not a staticmethod's
    first parameter) is bound, not passed."""
    params, defaults = list(scope.params), list(scope.param_defaults) or [""] * len(scope.params)
    if params and params[0] in ("self", "cls") and "staticmethod" not in scope.decorators:
        return params[1:], defaults[1:]
    return params, defaults


def bind_edge(caller: Func, call: Call, target: Func, env: Env, constants: Env) -> dict[str, Value]:
    """The values the call gives the target's parameters. Parameters the call
    leaves out take their default; a ``*args``/``**kwargs`` at the call makes
    every parameter it could fill unknown (sound)."""
    scope = target.scope
    if scope is None or (target.language is Language.PYTHON) != (caller.language is Language.PYTHON):
        return {}
    if target.language is not Language.PYTHON:
        return _bind_native(caller, call, scope.params, scope.param_defaults, env)
    params, defaults = call_params(scope)
    args = split_args(call.arglist)
    if any(a.keyword is None and a.text.startswith("*") for a in args):
        return {}
    spread = any(a.keyword is None and a.text.startswith("**") for a in args) or \
        any((a.keyword or "").startswith("**") for a in args)
    # the extractor keeps the first ARGLIST_CAP (1000) bytes of an argument list
    # (`extract/python_sites.py`): in a cut one, a parameter not seen may be
    # passed further on, so it does not take its default
    cut = len(call.arglist.encode("utf-8", "replace")) >= _PY_ARGLIST_CUT
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
        elif spread or cut:
            out[name] = UNKNOWN_VALUE
        elif default:
            value = literal_value(default, f"{where} passes no {name} (default {default})")
            out[name] = value if value is not None else UNKNOWN_VALUE
    for name in params:
        if name in keywords and name not in out:
            out[name] = value_of(caller, keywords[name].text, env, constants, f"{where} passes {name}=...")
    return {k: v for k, v in out.items() if v.known}


# a few bytes under the extractors' caps (C++ 400, Python 1000): a "replace"-decoded cut byte may shorten it
_ARGLIST_CUT = 396
_PY_ARGLIST_CUT = 996

_NATIVE_INT = re.compile(r"^[-+]?\d+[uUlL]*$")


def _bind_native(caller: Func, call: Call, params: tuple[str, ...], defaults: tuple[str, ...],
                 env: Env) -> dict[str, Value]:
    """C++/CUDA edges: positional arguments, then the defaults of the
    parameters the call leaves out (those written in the definition the call
    resolves to; one only a separate declaration gives is not read, so the
    parameter stays unknown). ``nullptr``/``NULL``/``0`` for a pointer,
    ``true``/``false``, integer literals, ``&x`` (never null) and forwarded
    parameters are known; a default is known when it is a literal
    (``native_literal``)."""
    out: dict[str, Value] = {}
    where = f"{caller.path}:{call.span.line}"
    args = split_args(call.arglist, True) if call.arglist.strip() else []
    for name, arg in zip(params, args):
        text = arg.text.strip()
        why = f"{where} passes {text}"
        name = name.lstrip("*&")
        value = native_literal(text, why)
        if value is not None:
            out[name] = value
        elif re.fullmatch(r"&\s*[A-Za-z_][\w.>-]*", text):
            out[name] = Value(LITERAL, True, f"{why} (an address, never null)")
        elif text.isidentifier() and text in env and env[text].known:
            inner = env[text]
            out[name] = Value(inner.kind, inner.literal, f"{why}, forwarded from {inner.why}")
    if len(args) < len(params) and defaults and len(call.arglist.encode("utf-8", "replace")) < _ARGLIST_CUT:
        for name, default in zip(params[len(args):], defaults[len(args):]):
            name = name.lstrip("*&")
            value = native_literal(default, f"{where} passes no {name} (default {default})") if default else None
            if name and value is not None:
                out[name] = value
    return out


def native_literal(text: str, why: str) -> Value | None:
    """A C++ literal: ``nullptr``/``NULL``, ``true``/``false``, an integer.
    An enumerator or a named constant is not read (its value is declared
    elsewhere, and an enumerator's truth is its hidden integer)."""
    if text in ("nullptr", "NULL"):
        return Value(NONE, None, why)
    if text in ("true", "false"):
        return Value(LITERAL, text == "true", why)
    if _NATIVE_INT.match(text):
        return Value(LITERAL, int(text.rstrip("uUlL")), why)
    return None


_IF = ("if", "elif", "else")


def sibling_branches(func: Func, one: int, other: int, kinds: Collection[str] | None = _IF) -> bool:
    """Lines ``one`` and ``other`` lie in different branches of one ``if``
    (``if ...: x = a`` / ``else: x = b``: one of them runs, never both), or
    of one statement of ``kinds`` (None: any but a loop, ``try``/``except``
    bodies included)."""
    branches = [b for b in func.blocks if b.stmt is not None
                and (b.kind != "loop" if kinds is None else b.kind in kinds)]
    return any(a.stmt == b.stmt and a is not b and a.span.contains_line(one) and b.span.contains_line(other)
               for a in branches for b in branches)


_FLAG_TEST = re.compile(r"([A-Za-z_]\w*)(?:\s+and\b.*)?", re.S)


def false_branches(func: Func, constants: Env) -> list[Span]:
    """The bodies of ``func``'s ``if``/``elif`` branches that cannot run:
    the test is a module constant bound once to a false literal and never
    rebound (``DEBUG = False`` ... ``if DEBUG:``), alone or first in an
    ``and`` (``if DEBUG and verbose:``)."""
    dead = []
    for block in func.blocks:
        if block.kind not in ("if", "elif"):
            continue
        m = _FLAG_TEST.fullmatch(block.test.strip())
        value = constants.get(m.group(1)) if m else None
        if value is not None and value.kind in (LITERAL, NONE) and not value.literal:
            dead.append(block.span)
    return dead


def rebound_between(func: Func, name: str, after: int, before: int | None = None,
                    continues: Callable[[str], bool] = lambda value: False) -> bool:
    """``name`` is bound again (a plain assignment, ``del``, or a call whose
    result it receives) after line ``after`` and before line ``before``
    (anywhere after it when None), on
    a path from one to the other: a binding in a sibling branch of the
    ``if`` holding ``after`` is another path. An augmented assignment
    (``x *= 2``) keeps the object, so it is no new binding, and neither is
    one whose value text ``continues`` says carries the old value on (a
    caller's notion: ``x = x[mask]`` for "what is built from it")."""
    lines = [a.line for a in func.assigns if a.op in ("=", "del") and name in (t.strip("() ") for t in a.targets)
             and not (a.op == "=" and continues(a.value.strip()))]
    lines += [c.span.line for c in func.calls if (c.target or "").strip() == name
              and not continues(f"{c.callee}({c.arglist})")]
    return any(after < n and (before is None or n < before) and not sibling_branches(func, after, n) for n in lines)

