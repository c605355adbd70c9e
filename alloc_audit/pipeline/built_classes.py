"""What class a variable holds where a model is built through it
(``model = model_cls(**kwargs)`` under a default-device context).

Input: the function that makes the call and the variable's name. Output: the
constructors the call runs when every value the variable can hold is a class
named in the project (a parameter every caller passes a class for, or leaves
at a class default; ``functools.partial(Cls, ...)``; ``A if c else B``; a
local bound to a class or to an entry of a module-level dict literal of classes), else ``None``: the
value comes from something no static reading resolves (a function's result, a
registry lookup, ``getattr``), and the caller falls back to every module
constructor (``default_device._fan_out``). ``cls(...)`` in a classmethod
builds the method's class or a subclass inheriting the factory: their
constructors, never an unrelated module's.
"""

from __future__ import annotations

import re

from ..arglists import split_args
from .index import ClassInfo, Func, ProjectIndex

_PARTIAL = re.compile(r"^(?:functools\.)?partial\(\s*([\w.]+)\s*[,)]")
_SUBSCRIPT = re.compile(r"^([A-Za-z_]\w*)\s*\[.*\]$", re.DOTALL)
_NAME = re.compile(r"^[A-Za-z_][\w.]*$")
_CHOICE = re.compile(r"^([A-Za-z_][\w.]*)\s+if\s+.+?\s+else\s+(.+)$", re.DOTALL)
DEPTH = 3  # caller edges followed back for a parameter


def built_constructors(index: ProjectIndex, func: Func, name: str, depth: int = 0) -> tuple[Func, ...] | None:
    """The constructors ``name(...)`` in ``func`` runs, or None when the
    class cannot be told."""
    if name == "cls" and func.owner is not None and func.scope is not None and func.scope.params[:1] == ("cls",):
        return own_constructors(index, func.owner)
    if any(c.target and name in (t.strip() for t in c.target.split(",")) for c in func.calls):
        return None  # a function's result (a registry lookup, getattr)
    bound = [a for a in func.assigns if name in (t.strip() for t in ",".join(a.targets).split(","))]
    if any(a.targets != (name,) for a in bound):
        return None  # unpacked from something
    scope = func.scope
    if scope is not None and name in scope.params:
        passed = _param_constructors(index, func, name, depth)
        local = _union(index, func, [a.value for a in bound], depth)
        return None if passed is None or local is None else passed + tuple(f for f in local if f not in passed)
    if not bound:
        return None
    return _union(index, func, [a.value for a in bound], depth)


def _union(index: ProjectIndex, func: Func, texts: list[str], depth: int) -> tuple[Func, ...] | None:
    out: list[Func] = []
    for text in texts:
        found = _class_text(index, func, text.strip(), depth)
        if found is None:
            return None
        out += [f for f in found if f not in out]
    return tuple(out)


def _class_text(index: ProjectIndex, func: Func, text: str, depth: int) -> tuple[Func, ...] | None:
    """The constructors of the class an expression names."""
    choice = _CHOICE.match(text)
    if choice:  # `LigerNorm if fused else Norm`: either class
        return _union(index, func, [choice.group(1), choice.group(2)], depth)
    partial = _PARTIAL.match(text)
    if partial:
        text = partial.group(1)
    subscript = _SUBSCRIPT.match(text)
    if subscript:
        return _registry(index, func, subscript.group(1), depth)
    if not _NAME.match(text):
        return None
    if text.isidentifier() and depth < DEPTH and (
            (func.scope is not None and text in func.scope.params) or any(text in a.targets for a in func.assigns)):
        return built_constructors(index, func, text, depth + 1)
    targets = index.resolve(func, text)
    if targets:
        return targets
    # the call table's callees carry resolved import aliases, an argument's
    # text does not: every project class of that name (a sound union)
    classes = index.classes_named(text.rsplit(".", 1)[-1])
    if classes:
        return tuple(f for cls in classes for f in index.constructors(cls))
    module = index.func(func.path, "<module>")
    head = text.split(".", 1)[0]
    if module is not None and module is not func and (
            any(c.target == head for c in module.calls) or any(head in a.targets for a in module.assigns)):
        return built_constructors(index, module, head, depth + 1) if text == head else None
    # a name that is no project class, function or module variable is a
    # library class (`nn.Linear`): it runs no project constructor
    return ()


def _registry(index: ProjectIndex, func: Func, name: str, depth: int) -> tuple[Func, ...] | None:
    """``REGISTRY[key]`` for a module-level dict literal of classes: the
    union of its values."""
    module = index.func(func.path, "<module>")
    if module is None:
        return None
    if any(c.target and name in (t.strip() for t in c.target.split(",")) for c in func.calls):
        return None  # a function's result (a registry lookup, getattr)
    values = [a.value.strip() for a in module.assigns if a.targets == (name,)]
    if len(values) != 1 or not values[0].startswith("{") or not values[0].endswith("}"):
        return None
    entries = [e.text.split(":", 1) for e in split_args(values[0][1:-1])]
    if not entries or any(len(e) != 2 for e in entries):
        return None
    return _union(index, module, [e[1] for e in entries], depth)


def _param_constructors(index: ProjectIndex, func: Func, name: str, depth: int) -> tuple[Func, ...] | None:
    """Every caller's argument for the parameter (or its class default)."""
    scope = func.scope
    if scope is None or depth >= DEPTH:
        return None
    params = list(scope.params)
    defaults = list(scope.param_defaults) or [""] * len(params)
    default = defaults[params.index(name)]
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    position = params.index(name) if name in params else -1
    texts: list[tuple[Func, str]] = []
    callers = [index.funcs[i] for i, d in index.callers_within([func], 1).items() if d == 1 and i in index.funcs]
    for caller in callers:
        for call in caller.calls:
            if func not in index.resolve(caller, call):
                continue
            args = split_args(call.arglist)
            keywords = {a.keyword: a.text for a in args if a.keyword is not None}
            positional: list[str] = []
            for a in args:
                if a.keyword is not None or a.text.startswith("*"):
                    break
                positional.append(a.text)
            spread = any(a.text.startswith("*") or (a.keyword or "").startswith("*") for a in args)
            if name in keywords:
                texts.append((caller, keywords[name]))
            elif 0 <= position < len(positional):
                texts.append((caller, positional[position]))
            elif spread:
                return None
            elif default:
                texts.append((func, default))
            else:
                return None
    if not texts:
        return None if not default else _union(index, func, [default], depth)
    out: list[Func] = []
    for where, text in texts:
        found = _union(index, where, [text], depth + 1)
        if found is None:
            return None
        out += [f for f in found if f not in out]
    return tuple(out)


def own_constructors(index: ProjectIndex, cls: ClassInfo) -> tuple[Func, ...]:
    """What ``cls(...)`` in a classmethod of ``cls`` runs: the constructors
    of the class and of its subclasses (a subclass calling the inherited
    factory), never those of unrelated classes."""
    out = list(index.constructors(cls))
    for name in index.subclass_names(cls.name):
        for sub in index.classes_named(name):
            out += [f for f in index.constructors(sub) if f not in out]
    return tuple(out)
