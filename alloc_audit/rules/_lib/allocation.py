"""Shared analysis for the rules: what an allocation is (issue 16, DESIGN.md
"Precision: what the allocation is"). A zero-element tensor holds no memory;
an op's output returned through an alias, a slice or a view is the caller's;
a buffer set once behind a "not yet set" test and kept on the object is
one-time initialisation, not per-call scratch. Pure functions over facts."""

from __future__ import annotations

import re

from ...arglists import split_top_level
from ...model import Block, Site
from ...pipeline.index import Func

_ZERO = re.compile(r"^\(?\s*0\s*\)?$")
# factories whose positional arguments are the dimensions (not arange's start)
_SHAPED = re.compile(r"(?:^|[.:])(?:empty|zeros|ones|full|rand|randn|empty_strided|new_empty|new_zeros|new_ones|"
                     r"new_full|empty_cuda)$")


def holds_no_memory(site: Site) -> bool:
    """``torch.empty(0)``, ``torch.zeros((0, 128))``, ``torch.empty([0])``:
    a literal 0 dimension means zero elements."""
    if not site.shape or _SHAPED.search(site.api) is None:
        return False
    dims: list[str] = []
    entries = site.shape[:1] if site.api.endswith("full") else site.shape  # full's second argument is the value
    for entry in entries:
        text = entry.strip()
        if text[:1] in "([" and text[-1:] in ")]":
            dims += split_top_level(text[1:-1])
        else:
            dims.append(text)
    return any(_ZERO.match(d.strip()) for d in dims if d.strip())


# methods whose result shares the tensor's storage (or is the tensor)
_VIEWS = ("view", "reshape", "flatten", "view_as", "narrow", "squeeze", "unsqueeze", "transpose", "permute",
          "contiguous", "t", "as_strided", "unflatten", "expand", "select", "split", "chunk", "unbind",
          "resize_", "detach", "fill_", "zero_", "copy_")
_VIEW_OF = re.compile(r"^\(?\s*([A-Za-z_]\w*)\s*(?:\[.*\]|\.(?:" + "|".join(_VIEWS) + r")\s*\(.*\))\s*\)?$", re.DOTALL)


def base_of_view(text: str) -> str | None:
    """``out.view(n, 4)`` / ``padded[:n]`` / ``buf.flatten()`` -> the base name."""
    m = _VIEW_OF.match(text.strip())
    return m.group(1) if m is not None else None


def returned_views(func: Func, names: set[str]) -> set[str]:
    """Names whose storage the function returns through a view or an alias:
    ``return out.view(...)``, ``return padded[:n]``, ``result = buf.flatten();
    return result``."""
    out: set[str] = set()
    items: list[str] = []
    for r in func.returns:
        value = r.value.strip()
        if value.startswith(("(", "[")) and value.endswith((")", "]")) and base_of_view(value) is None:
            value = value[1:-1]
        items += [i.strip() for i in split_top_level(value)]
    for item in items:
        base = base_of_view(item)
        if base is not None:
            out.add(base)
    # aliases: `result = buf.flatten()` where result is returned
    wanted = names | out | set(items)
    for _round in range(3):
        added = False
        for call in func.calls:
            if call.target in wanted:
                receiver = call.callee.rpartition(".")[0]
                base = base_of_view(f"{call.callee}({call.arglist})")
                base = base or (receiver if receiver.isidentifier() and call.callee.rpartition(".")[2] in _VIEWS
                                else None)
                if base and base not in out:
                    out.add(base)
                    wanted.add(base)
                    added = True
        for assign in func.assigns:
            # `out += part` adds part's values into out; only `out = part` aliases it
            if assign.op == "=" and any(t in wanted for t in assign.targets):
                base = base_of_view(assign.value) or (assign.value.strip() if assign.value.strip().isidentifier()
                                                      else None)
                if base and base not in out:
                    out.add(base)
                    wanted.add(base)
                    added = True
        if not added:
            break
    return out


_UNSET_TEST = (
    # Python: `x is None`, `not hasattr(self, "x")`, `not x`, `x.numel() == 0`
    r"{t}\s+is\s+None",
    r"not\s+hasattr\(\s*self\s*,\s*['\"]{attr}['\"]\s*\)",
    r"not\s+{t}(?![\w.\[(])",
    # C++: `!x.defined()`, `x == nullptr`, `!x`
    r"!\s*{t}\s*\.\s*defined\(\s*\)",
    r"{t}\s*==\s*(?:nullptr|NULL)",
    r"!\s*{t}(?![\w.\[(>-])",
)
_SIZE_TEST = re.compile(r"[<>]|!=|\.(?:numel|shape|size|nbytes)\b|\blen\(")


def is_one_time_init(func: Func, site: Site) -> str | None:
    """A buffer set behind a test that it is not set yet (``if self._buf is
    None``, ``if not hasattr(self, "_buf")``, ``if (!buf.defined())``, a
    ``self._ready`` flag), kept on the object or in a member, is one-time
    initialisation: the reason, or None. A test that also compares sizes is
    growth (grow-on-demand's business), not one-time."""
    target = site.target
    if not target:
        return None
    python = site.path.endswith((".py", ".pyi"))
    if python and not target.startswith(("self.", "cls.")):
        return None
    if not python and not _kept_native(func, target):
        return None
    attr = target.split(".", 1)[1] if "." in target else target
    for block in _enclosing_ifs(func, site):
        test = block.test
        if _SIZE_TEST.search(test):
            continue
        escaped = re.escape(target)
        if any(re.search(p.format(t=escaped, attr=re.escape(attr)), test) for p in _UNSET_TEST):
            return f"set once behind `{test}`"
        if python and re.fullmatch(r"not\s+self\.\w+", test.strip()):
            return f"set once behind the flag `{test}`"
    return None


def _kept_native(func: Func, target: str) -> bool:
    """A C++ target that outlives the call: a member (not a parameter, not a
    local), a local reference into one (`at::Tensor& ref = cache_[i]`), a
    static local."""
    name = target.lstrip("*&")
    scope = func.scope
    if scope is not None and name in {p.lstrip("*&") for p in scope.params}:
        return False
    declared = [a for a in func.assigns if a.type is not None and name in a.targets]
    if not declared:
        return True
    return any((a.type or "").startswith("static ") or "&" in (a.type or "") for a in declared)


def _enclosing_ifs(func: Func, site: Site) -> list[Block]:
    return [b for b in func.blocks if b.kind == "if" and b.span.contains(site.span)]
