"""Stage 5, with the same-device moves: a module or tensor moved again to
the device an earlier statement of the same function moved it to moves
nothing (issue 11, round 35).

    embed = Embed(hidden, n_tokens)
    embed.load_pretrained(path, device=device)   # its last statement: self.to(device)
    self.embed = embed.to(device)                # no site: already there

Input: the sites and the project index. Output: the sites less such moves.
The move is ``R.to(D)`` of a local ``R`` (``D`` a name or attribute chain).
The last statement above it that touches ``R`` moved it to ``D``: ``R.to(D)``
itself (of a module, which moves in place, or bound back: ``R = R.to(D)``),
or a call ``R.m(..., D)`` where every method the call resolves to
ends, at its top level, with ``self.to(P)`` for the parameter ``P`` the call
binds ``D`` to (and binds ``P`` nowhere). Between the two nothing binds ``R``,
an attribute of it or ``D``'s root, calls a method of ``R`` or hands ``R`` on,
and both lie in the same blocks (no branch, loop or handler around one of
them only). False: ``m.to(d); m.add_module("x", nn.Linear(2, 2)); m.to(d)``
(a new layer in between), ``m.load(path, device=other)`` then ``m.to(d)``,
a method with code after its ``self.to``. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Call, Site
from .index import Func, ProjectIndex
from .move_apis import TO_MOVES, without_moves


def drop_moved_again(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    return without_moves(sites, TO_MOVES, lambda s: _moved_again(s, index))


def _moved_again(site: Site, index: ProjectIndex) -> bool:
    found = index.site_call(site)
    if found is None:
        return False
    func, move = found
    receiver, _, method = move.callee.rpartition(".")
    args = split_args(move.arglist)
    if method != "to" or not receiver.isidentifier() or len(args) != 1 or args[0].keyword not in (None, "device"):
        return False
    device = args[0].text.strip()
    if re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", device) is None:
        return False
    line = move.span.line
    touching = [c for c in func.calls if c.span.line < line and _touches(c, receiver)]
    if not touching:
        return False
    last = max(c.span.line for c in touching)
    prior = [c for c in touching if c.span.line == last]
    if len(prior) != 1 or not prior[0].callee.startswith(receiver + ".") or not _same_blocks(func, last, line):
        return False
    root = device.split(".")[0]
    if any(last <= a.line < line and any(t.strip() == root or t.strip() == receiver and a.line > last
                                         or t.strip().startswith(receiver + ".") for t in a.targets)
           for a in func.assigns):
        return False  # the receiver or the device bound again between
    call = prior[0]
    if call.callee == receiver + ".to":
        # a module moves in place; a tensor's copy is there only when bound back (`x = x.to(d)`)
        given = split_args(call.arglist)
        return len(given) == 1 and given[0].keyword in (None, "device") and given[0].text.strip() == device \
            and (site.api == "Module.to" or (call.target or "").strip() == receiver)
    methods = index.resolve(func, call) or _methods_of_built(func, receiver, call, index)
    return bool(methods) and all(_ends_moving(m, call, device) for m in methods)


def _methods_of_built(func: Func, receiver: str, call: Call, index: ProjectIndex) -> tuple[Func, ...]:
    """The methods ``call`` (``R.m(...)``) runs where the function binds ``R`` once, to a construction of a
    project class (``R = Embed(...)``)."""
    built = [c for c in func.calls if (c.target or "").strip() == receiver]
    if len(built) != 1 or any(receiver in a.targets for a in func.assigns):
        return ()
    cls = index.constructed_class(func, built[0])
    return tuple(index.method_lookup(cls, call.callee.rpartition(".")[2])) if cls is not None else ()


def _touches(call: Call, receiver: str) -> bool:
    """``call`` is a method of ``receiver`` or hands it on."""
    return call.callee.split(".")[0] == receiver or re.search(rf"(?<![\w.]){re.escape(receiver)}\b",
                                                               call.arglist) is not None


def _same_blocks(func: Func, a: int, b: int) -> bool:
    return all(block.span.contains_line(a) == block.span.contains_line(b) for block in func.blocks)


def _ends_moving(method: Func, call: Call, device: str) -> bool:
    """``method``'s last statement, at its top level, is ``self.to(P)`` for the parameter ``P`` ``call`` binds
    to ``device``, which the method binds nowhere."""
    scope = method.scope
    if scope is None or not method.calls:
        return False
    params = [p for p in scope.params if p not in ("self", "cls")]
    given = split_args(call.arglist)
    param = next((a.keyword for a in given if a.keyword and a.text.strip() == device), None)
    if param is None:
        positional = [a for a in given if a.keyword is None]
        at = next((i for i, a in enumerate(positional) if a.text.strip() == device), -1)
        param = params[at] if 0 <= at < len(params) and not any(a.text.startswith("*") for a in given) else None
    if param is None or param not in params or any(param in a.targets for a in method.assigns):
        return False
    final = max(method.calls, key=lambda c: (c.span.end_line, c.span.end_col))
    moved = split_args(final.arglist)
    return final.callee == "self.to" and len(moved) == 1 and moved[0].keyword in (None, "device") \
        and moved[0].text.strip() == param and not any(b.span.contains_line(final.span.line) for b in method.blocks) \
        and not any(a.line > final.span.line for a in method.assigns) and not method.returns
