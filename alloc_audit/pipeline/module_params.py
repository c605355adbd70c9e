"""Stage 5, before the tiers (asked by ``module_classes.module_moves``,
round 28): a move of a helper's parameter (``def to_device(model, device):
return model.to(device)``) moves a module when every call of the helper
hands in, for that parameter, what the caller shows is a module.

Input: the move's function, the receiver text less its casts, and
``module_classes``' own tests (a call that builds a module, a builder
named for one, the one construction a member is bound to). The receiver is
a parameter nothing in the function rebinds above the move; every call
that may reach the function (one at least, each resolved to it, at most
``_MAX_CALLERS``) hands in a local or ``self.x`` the caller last bound to
a call that builds a module: a project module class, a ``torch.nn`` layer,
a library model's ``from_pretrained``/``from_config``, a model maker, or a
project function whose every return builds one. One caller handing in a
tensor, a parameter of its own, an expression or nothing keeps the site a
tensor copy. Pure.
"""

from __future__ import annotations

from collections.abc import Callable

from ..arglists import split_args
from ..model import Call, Site
from .index import Func, ProjectIndex, last_name
from .module_returns import returns_module
from .names import IDENTIFIER

Builds = Callable[[Func, Call], bool]
Named = Callable[[str], bool]
MemberBuilder = Callable[[Func, str, str], "Call | None"]

_SELF_PARAMS = frozenset({"self", "cls"})
# a helper called from more places than this is a general utility: not followed
_MAX_CALLERS = 12


def module_parameter(index: ProjectIndex, func: Func, site: Site, receiver: str, builds: Builds, named: Named,
                     member_builder: MemberBuilder, memo: dict[tuple[str, str], str]) -> str:
    """Why the move at ``site`` of ``receiver``, a parameter of ``func``,
    moves a module handed in by every caller, or "". Memoised per
    (function, parameter)."""
    scope = func.scope
    param = receiver
    if scope is None or not param.isidentifier() or param not in scope.params or param in _SELF_PARAMS:
        return ""
    line = site.stmt_line or site.span.line
    if any(param in a.targets and a.line < line and not a.value.startswith(param + ".") for a in func.assigns) or any(
            (c.target or "").strip() == param and c.span.line < line and not c.callee.startswith(param + ".")
            for c in func.calls):
        return ""  # rebound above the move: what is moved is not what was handed in
    key = (func.id, param)
    why = memo.get(key)
    if why is None:
        why = memo[key] = _callers_pass_module(index, func, param, builds, named, member_builder)
    return why


def _callers_pass_module(index: ProjectIndex, func: Func, param: str, builds: Builds, named: Named,
                         member_builder: MemberBuilder) -> str:
    assert func.scope is not None
    params = list(func.scope.params)
    position = params.index(param) - (1 if params and params[0] in _SELF_PARAMS else 0)
    reaching = index.calls_reaching(func)
    if not reaching or len(reaching) > _MAX_CALLERS:
        return ""
    shown = []
    for caller, call, resolved in reaching:
        if not resolved:
            return ""
        args = split_args(call.arglist)
        passed = next((a for a in args if a.keyword == param), None)
        if passed is None:
            positional = [a for a in args if a.keyword is None and not a.text.lstrip().startswith("**")]
            if any(a.text.lstrip().startswith("*") for a in positional[:position + 1]):
                return ""
            passed = positional[position] if 0 <= position < len(positional) else None
        text = passed.text.strip() if passed is not None else ""
        bound = _bound_before(caller, text, call.span.line, func.name, member_builder)
        if bound is None:
            return ""
        built, element = bound
        if element is not None:  # `model, tok = load(...)`: the project function's returned tuples
            if not _returns_module_element(index, caller, built, element, builds, named):
                return ""
        elif not (builds(caller, built) or named(last_name(built.callee)) or _library_builder(index, built)
                  or returns_module(index, caller, built, builds)):
            return ""
        shown.append(f"{caller.qualname}:{call.span.line} hands in {text}, built by {built.callee}")
    return f"every call hands in a module: {'; '.join(shown[:2])}{' ...' if len(shown) > 2 else ''}"


def _bound_before(caller: Func, text: str, line: int, helper: str,
                  member_builder: MemberBuilder) -> tuple[Call, int | None] | None:
    """The call ``text`` (a local or ``self.x``) was last bound to above
    ``line`` in ``caller`` (its casts and modes, ``model = model.eval()``,
    skipped), with which element of a tuple it took (``model, tok =
    load(...)``: 0; None for the whole value), or for ``self.x`` the one
    construction its class binds it to (a call of ``helper``, which hands
    back what it is handed, aside); None when a plain assignment binds it
    after that call or nothing tells."""
    if text.startswith("self.") and IDENTIFIER.fullmatch(text[5:]) is not None and caller.owner is not None:
        member = member_builder(caller, text, helper)
        return (member, None) if member is not None else None
    table = caller.table
    if IDENTIFIER.fullmatch(text) is None or table is None:
        return None
    pos = table.positions
    above = [(c, _element(table.targets[i] or "", text)) for i in caller.call_ix if pos[4 * i] < line
             for c in (table[i],) if "(" not in c.callee and not c.callee.startswith(text + ".")]
    above = [(c, k) for c, k in above if k != -1]
    if not above:
        return None
    last, element = max(above, key=lambda ck: (ck[0].span.line, ck[0].span.col))
    if any(text in a.targets and last.span.line < a.line < line and not a.value.startswith(text + ".")
           for a in caller.assigns):
        return None
    return last, element


def _element(target: str, name: str) -> int | None:
    """Where ``name`` sits in an assignment's ``target``: None for the
    whole target, its position in a plain tuple of names, -1 when absent."""
    target = target.strip()
    if target == name:
        return None
    names = [t.strip().strip("()") for t in target.split(",")]
    return names.index(name) if name in names and all(IDENTIFIER.fullmatch(n) for n in names) else -1


def _returns_module_element(index: ProjectIndex, caller: Func, call: Call, element: int, builds: Builds,
                            named: Named) -> bool:
    """Every project function ``call`` may run returns tuples whose
    ``element`` is a local it bound to a call that builds a module
    (``model = AutoModel.from_pretrained(...)`` ... ``return model, tok``)."""
    targets = index.resolve(caller, call)
    if not targets:
        return False
    for target in targets:
        values = [r for r in target.returns if r.value and r.value != "None"]
        if not values:
            return False
        for ret in values:
            parts = split_args(ret.value.strip().strip("()"))
            if len(parts) <= element or parts[element].keyword is not None:
                return False
            name = parts[element].text.strip()
            bound = _bound_before(target, name, ret.line + 1, "", lambda f, t, h: None)
            if bound is None or bound[1] is not None:
                return False
            made = bound[0]
            if not (builds(target, made) or named(last_name(made.callee)) or _library_builder(index, made)):
                return False
    return True


def _library_builder(index: ProjectIndex, call: Call) -> bool:
    """``Class.from_pretrained(...)`` / ``Class.from_config(...)`` of a
    library class (no project file defines it): a model (tokenizers and
    configs have no ``.to`` a helper could call)."""
    head, _, leaf = call.callee.rpartition(".")
    cls = last_name(head) if head else ""
    return leaf in ("from_pretrained", "from_config") and cls[:1].isupper() and not index.classes_named(cls)
