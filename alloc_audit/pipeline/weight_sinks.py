"""Round 32: more places a value becomes a module's weight, for
``weight_fills``' value flow (issue 11; docs/tiers.md 2: the temporaries
that build a weight take the load tier, T1).

``weight_fills.weight_writes`` counts a weight rebuilt as a parameter
(``conv.bias = nn.Parameter(...)``), its storage rebound (``.data``) and an
in-place change. What a function itself does with a value also makes it a
weight when it

- stores it whole into another module's weight attribute
  (``module.weight = q`` where ``module`` is no ``self``: a registered
  buffer replaced, ``Module.__setattr__`` keeps it registered);
- installs it with ``setattr(layer, name, nn.Parameter(q))``;
- fills a member its own class registers as a buffer or binds to a
  parameter (``weight_member``), whole: ``self.B[:, :] = q.to(d)``,
  ``self.B.copy_(q)``, ``self.B = q``, in a method that is handed
  something and reads another module's weight (``linear.weight``): a
  ``pack`` of a quantised layer converting the layer it replaces.

True: ``q = pack(w.to(d))`` ... ``module.weight = q`` in a repacking
function: ``w.to(d)`` is T1. False (``sink_writes`` gives nothing): a
``forward``/``__call__`` (an in-place change per call), a function that
runs a training step itself (calls ``backward`` or an optimizer's
``step``: it writes parameters each step), ``ctx.weight = w`` in an
autograd function (no module), and a registered buffer written at
positions (``self.k_cache[:, pos] = k``: a slab, docs/tiers.md 1). A
member the class neither registers nor makes a parameter is plain state,
whatever its name; a method filling its own buffer from no weight
(``self.amax.copy_(y.abs().amax())``: calibration statistics of an
activation) or from nothing it is handed (``refresh(self)``) is no packing.

``load_hook``: a function its own file registers as a ``load_state_dict``
hook (``self._register_load_state_dict_pre_hook(self.load_hook)``, a
module-level function handed to ``register_load_state_dict_post_hook``)
runs inside ``load_state_dict``: what it makes (``state_dict[prefix +
"zeros"] = torch.zeros_like(scales)``, a position table resized for the
checkpoint) is made while the weights load, T1. False: a forward hook
(``register_forward_pre_hook``) runs per call, a ``state_dict`` (save)
hook per save; a function of that name in another file. Pure.
"""

from __future__ import annotations

import re

from ..arglists import split_args
from .index import Func, ProjectIndex
from .lazy_members import weight_member
from .names import IDENTIFIER


def weight_names(plural: bool) -> str:
    """The pattern of a module's weight attribute names (``weight``,
    ``qzeros``, ``scales``, ``g_idx``, ``attn_bias``, ...), with the plural
    ``weights`` or without it (a sampler's or a loss's weights are no
    module's): ``weight_fills`` reads fills of either, a store whole here only
    the singular."""
    return r"(?:\w+_)?(?:q?weight" + ("s?" if plural else "") + r"|bias|q?zeros|scales?|g_idx|perm|codebooks?)"


_WEIGHT = weight_names(plural=False)
# another object's weight attribute stored whole (`module.weight = q`), not the object's own nor a context's
_OTHER = re.compile(r"(?!self\.|ctx\.)[A-Za-z_][\w.]*\.(" + _WEIGHT + r")")
# the object's own member filled whole: `self.B`, `self.B.data`, `self.B[:, :]`, `self.B[...]`
_OWN = re.compile(r"(self\.[A-Za-z_]\w*)(?:\.data)?(?:\[\s*(?:\.\.\.|:(?:\s*,\s*:)*)\s*\])?")
_OWN_COPY = re.compile(r"(self\.[A-Za-z_]\w*)(?:\.data)?\.copy_")
_READ_WEIGHT = re.compile(r"\b([A-Za-z_][\w.]*?)\.(?:q?weight|bias)\b")
_PER_CALL = frozenset({"forward", "__call__"})
_LOAD_HOOKS = frozenset({f"{p}register_load_state_dict_{w}_hook" for p in ("", "_") for w in ("pre", "post")})
_Write = tuple[int, str, str, bool]  # line, value text, the weight, rebound (not changed in place)


def sink_writes(func: Func) -> list[_Write]:
    """(line, value text, weight, rebound) of each store of a value into a
    module's weight that ``weight_fills.weight_writes`` does not count."""
    if func.name in _PER_CALL or _steps(func):
        return []
    stores = [(a.line, a.targets[0].strip(), a.value) for a in func.assigns if a.op == "=" and len(a.targets) == 1]
    stores += [(c.span.line, c.target.strip(), f"{c.callee}({c.arglist})") for c in func.calls if c.target]
    found: list[_Write] = []
    packs: list[bool] = []  # `_packs(func)`, asked only where an own member is filled (most functions fill none)

    def packing() -> bool:
        if not packs:
            packs.append(_packs(func))
        return packs[0]

    for line, target, value in stores:
        if _OTHER.fullmatch(target):
            found.append((line, value, f"{target} (stored)", True))
            continue
        own = _OWN.fullmatch(target)
        if own and packing() and weight_member(func, own.group(1)):
            found.append((line, value, f"{target} (its own weight)", True))
    for c in func.calls:
        own = _OWN_COPY.fullmatch(c.callee)
        if own and packing() and weight_member(func, own.group(1)):
            found.append((c.span.line, c.arglist, f"{own.group(1)} (its own weight, in place: copy_)", False))
        elif c.callee == "setattr":
            args = split_args(c.arglist)
            if len(args) == 3 and re.match(r"\s*(?:[\w.]+\.)?Parameter\(", args[2].text):
                found.append((c.span.line, args[2].text, f"{args[0].text.strip()}.<{args[1].text.strip()}> "
                                                          f"(set as a parameter)", True))
    return found


def _packs(func: Func) -> bool:
    """``func`` is handed something and reads another module's weight
    (``linear.weight``, ``layer.self_attn.q_proj.bias``; not its own)."""
    scope = func.scope
    if scope is None or not [p for p in scope.params if p.lstrip("*") not in ("self", "cls")]:
        return False
    texts = [a.value for a in func.assigns] + [f"{c.callee}({c.arglist})" for c in func.calls]
    # every match of `_READ_WEIGHT` holds `weight` or `bias`: a text without either has none
    return any(m.group(1) != "self" for t in texts if "weight" in t or "bias" in t for m in _READ_WEIGHT.finditer(t))


def _steps(func: Func) -> bool:
    """``func`` runs a training step itself: ``loss.backward()``,
    ``optimizer.step()`` (``optim`` in the receiver)."""
    return any(c.callee.endswith(".backward") or (c.callee.endswith(".step") and "optim" in c.callee.lower())
               for c in func.calls)


def load_hook(func: Func, index: ProjectIndex, memo: dict[str, dict[str, str]]) -> str:
    """Where ``func``'s own file registers it as a ``load_state_dict`` hook
    (``path:line``), or ""."""
    hooks = memo.get(func.path)
    if hooks is None:
        hooks = memo[func.path] = {}
        # read from the file's call columns, in ``other.calls``' order (``call_ix``), no ``Call`` built: a pass
        # asks of every file with a site, and the calls that register a hook are few (perf-r35b: 63,000 of
        # flashinfer's 157,000 ``Call``s were first built here, for this test of their callee)
        for other in index.functions_in(func.path):
            table = other.table
            if table is None:
                continue
            callees, arglists = table.callees, table.arglists
            for i in other.call_ix:
                if callees[i].rpartition(".")[2] in _LOAD_HOOKS and arglists[i].strip():
                    names = [n for n in IDENTIFIER.findall(split_args(arglists[i])[0].text)
                             if n not in ("self", "functools", "partial")]
                    if names:
                        hooks.setdefault(names[0], f"{func.path}:{table.line(i)}")
    return hooks.get(func.name, "")
