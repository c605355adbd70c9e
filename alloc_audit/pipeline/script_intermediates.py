"""Stage 5, after ``lifetimes``: a module-level name rebound later drops the
tensor it held: a script's intermediate, T4 (issue 11, round 23).

    x = torch.randn(10, device="cuda:0")   # T4: dropped when x is rebound
    print(op(x, x))
    x = torch.randn(10, device="cuda:1")   # T2: kept to the end of the script

A tensor a plain module-level name holds (also under ``if __name__ ==
"__main__":``, which is module level too), that a later module-level
statement rebinds or deletes (``x = ...``, ``temp = []``, ``del x``), is
dropped there. The rebinding must run whenever the site ran (it lies in no
branch or loop the site is outside of: a sibling branch may not run), and
nothing may keep the tensor first: an alias (``y = x``), a store on an object
or into a display (``held = [x]``; iterating it, ``[t * 2 for t in x]``,
makes new values), or a call that keeps its argument (``.append(x)``,
``register_buffer``, ``Thread``) keeps the site T2, as does the last binding
of the name, kept to the end of the script. Only direct device sites that
``lifetimes`` left module level (T2) are read. A module-level site that
stays under ``if __name__ == "__main__":`` says so in its reason: it runs
when the file is run as a script, not at import (once: T2).

Round 29: a rebinding at the top of the body of a later module-level loop
(``batch = ...`` in ``for step in range(n):`` after a warm-up ``batch =
torch.rand(...)`` used once) drops the tensor on the loop's first pass: the
value served the statements before the loop only. The name may also be
bound to a view of the allocation (``ids = t.to(d)[:, :n]``): the view
holds it, and dropping the view drops it. And the opposite: what a
module-level loop makes per pass (T4) is kept when each pass adds it whole
(itself, a view of it, or an item of a tuple it adds) to a plain name bound
before the loop and not rebound in it (``groups.append((a_q, a_sc))``,
``table[i] = buf``): every pass's value stays reachable after the loop, to
the end of the script, T2 (the inputs a benchmark's later loops reuse). Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..arglists import split_top_level
from ..model import Language, Site, SiteKind, Tier
from .extract.python_kept import VIEW_METHODS, VIEW_TAIL
from .index import Func, ProjectIndex
from .lifetimes import PER_LOOP


def script_intermediates(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    out = []
    for site in sites:
        if site.scope == "<module>" and site.language is Language.PYTHON:
            func = index.func(site.path, "<module>")
            if func is not None and site.tier is Tier.T2 and site.kind is SiteKind.DEVICE and site.via is None \
                    and (dropped := _rebound_later(site, func))[1]:
                site = dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                    f"a script's intermediate: module-level {dropped[0]} is {dropped[1]}, and nothing kept it before"))
            elif func is not None and site.tier_reason == _AT_IMPORT and _in_main_block(site, func):
                site = dataclasses.replace(site, tier_reason=_IN_MAIN)
            elif func is not None and site.tier is Tier.T4 and site.via is None \
                    and site.tier_reason.startswith(PER_LOOP) and (kept := _kept_across(site, func)):
                site = dataclasses.replace(site, tier=Tier.T2, tier_reason=(
                    f"module level, made per iteration of a loop and kept: {kept}, which lives to the end of the "
                    "script"))
        out.append(site)
    return out


_AT_IMPORT = "module level (runs at import)"  # rules/tiers.toml
_IN_MAIN = 'module level, under `if __name__ == "__main__":` (runs once, when the file is run as a script)'
_MAIN_TEST = re.compile(r"""__name__\s*==\s*(['"])__main__\1|(['"])__main__\2\s*==\s*__name__""")


def _in_main_block(site: Site, func: Func) -> bool:
    """The site lies in the body of ``if __name__ == "__main__":``: it runs
    when the file is run, not when it is imported (still once: T2)."""
    return any(b.kind.startswith("if") and _MAIN_TEST.fullmatch(b.test.strip()) is not None
               and b.span.contains_line(site.span.line) for b in func.blocks)


# a call that keeps its argument: put into a container, registered, handed to a thread
_KEEPS = re.compile(r"(?:^|\.)(?:append|appendleft|extend|insert|add|put|setdefault|update|register_\w+|"
                    r"Parameter|Thread|Process|submit|apply_async|setattr)$")


def _rebound_later(site: Site, func: Func) -> tuple[str, str]:
    """The name and how the module drops the tensor it holds: ``rebound at
    line N`` (or ``deleted``) by a statement that runs whenever the site ran
    (in no block the site is outside of: not a sibling branch; or at the top
    of a later loop's body), with no alias, store or keeping call of the name
    in between; or ("", "")."""
    line = site.stmt_line or site.span.line
    name = (site.target or "").strip() or _viewed_into(site, func, line)
    if not name.isidentifier():
        return "", ""
    end_line = site.span.end_line
    enclosing = [b for b in func.blocks if b.span.contains_line(line)]
    later: list[tuple[int, str]] = []
    for a in func.assigns:
        if a.line > end_line and name in a.targets and a.op in ("=", "del"):
            later.append((a.line, "deleted" if a.op == "del" else f"rebound at line {a.line}"))
    later += [(c.span.line, f"rebound at line {c.span.line}") for c in func.calls
              if c.span.line > end_line and (c.target or "").strip() == name]
    word = re.compile(rf"\b{re.escape(name)}\b")
    for at, how in sorted(later):
        outside = [b for b in func.blocks if b.span.contains_line(at) and b not in enclosing]
        if len(outside) == 1 and outside[0].kind == "loop" and how != "deleted" and not _reads_itself(func, at, word):
            loop = outside[0]
            how = f"{how}, at the top of the loop at line {(loop.stmt or loop.span).line} (its first pass)"
        elif outside:
            continue  # in a branch the site is not in, nested in a later loop, or a loop's `x = f(x)`: may not run
        for a in func.assigns:
            if line < a.line < at and word.search(a.value) and (
                    a.value.strip() == name or any(not t.isidentifier() for t in a.targets)
                    or _in_display(a.value, name, word)):
                return "", ""  # aliased, stored on an object or in a display
        for c in func.calls:
            if line < c.span.line <= at and _KEEPS.search(c.callee) and word.search(c.arglist):
                return "", ""
        return name, how
    return "", ""




_VIEWS = frozenset(VIEW_METHODS.split("|"))
_ADDS = re.compile(r"([A-Za-z_]\w*)\.(?:append|extend|insert|appendleft|add)")


def _kept_across(site: Site, func: Func) -> str:
    """Where a module-level loop keeps what one pass makes: a plain name
    bound before the outermost loop (and not rebound in it) that the pass
    adds the allocation to whole (``groups.append((a, b_sc))``,
    ``caches.append(k.to(d))``, ``table[i] = buf``), so every pass's value
    stays reachable after the loop; or ""."""
    loops = [b for b in func.blocks if b.kind == "loop" and b.span.contains_line(site.span.line)]
    if not loops:
        return ""
    first = min((b.stmt or b.span).line for b in loops)
    last = max(b.span.end_line for b in loops)
    name = (site.target or "").strip()
    if name and not name.isidentifier():
        return ""
    if name and any(c.span.line == site.span.line and (c.target == name or c.span.col == site.span.col)
                    and c.callee.startswith("(...).") and c.callee.rsplit(".", 1)[-1] not in _VIEWS
                    for c in func.calls):
        return ""  # `up = torch.randn(n, device="cuda").to("cpu")`: the name holds another tensor
    leaf = site.api.rsplit(".", 1)[-1]

    def whole(item: str) -> bool:
        item = item.strip()
        if item[:1] in "([" and item[-1:] in ")]" and last_call(item) == "":
            return any(whole(part) for part in split_top_level(item[1:-1]))
        return item == name if name else last_call(item) == leaf and item.endswith(")")

    def bound_before(owner: str) -> bool:
        lines = [a.line for a in func.assigns if owner in a.targets and a.op in ("=", "del")] + \
            [c.span.line for c in func.calls if (c.target or "").strip() == owner]
        return any(line < first for line in lines) and not any(first <= line <= last for line in lines)

    for c in func.calls:
        if not (site.span.line <= c.span.line <= last or c.span.line <= site.span.line <= c.span.end_line):
            continue
        m = _ADDS.fullmatch(c.callee)
        if m is None or (not name and not c.span.line <= site.span.line <= c.span.end_line):
            continue
        if any(whole(item) for item in split_top_level(c.arglist)) and bound_before(m.group(1)):
            return f"added to {m.group(1)} (line {c.span.line}), bound before the loop at line {first}"
    for a in func.assigns:
        if name and site.span.line < a.line <= last and a.op == "=" and a.value.strip() == name:
            owner = next((t.split("[", 1)[0] for t in a.targets if re.fullmatch(r"[A-Za-z_]\w*\[.+\]", t)), "")
            if owner and bound_before(owner):
                return f"stored into {owner} (line {a.line}), bound before the loop at line {first}"
    return ""


def _reads_itself(func: Func, at: int, word: re.Pattern[str]) -> bool:
    """The rebinding at line ``at`` reads the name (``v = norm(v)`` in a
    loop: the value seeds every pass, not only the first)."""
    return any(a.line == at and word.search(a.value) for a in func.assigns) or any(
        c.span.line == at and (word.search(c.arglist) or word.match(c.callee)) for c in func.calls)


def _viewed_into(site: Site, func: Func, line: int) -> str:
    """The plain name a module-level statement binds to a view of the
    allocation (``ids = t.to(d)[:, :n]``, ``x = torch.rand(n).view(a, b)``:
    the call that allocates, then only views), or ""."""
    leaf = site.api.rsplit(".", 1)[-1]
    for a in func.assigns:
        if a.line != line or a.op != "=" or len(a.targets) != 1 or not a.targets[0].isidentifier():
            continue
        value = a.value.strip()
        call_end = value.find(")", value.find(leaf + "("))
        while call_end >= 0:
            tail = VIEW_TAIL.match(value, call_end + 1)
            if tail is not None and tail.end() == len(value) and tail.end() > call_end + 1 \
                    and last_call(value[:call_end + 1]) == leaf:
                return a.targets[0]
            call_end = value.find(")", call_end + 1)
    return ""


def last_call(text: str) -> str:
    """The name of the call that ends ``text`` (``a.b(c(d))`` -> ``b``)."""
    depth = 0
    for at in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[at], 0)
        if depth == 0:
            m = re.search(r"([A-Za-z_]\w*)\s*$", text[:at])
            return m.group(1) if m is not None else ""
    return ""


def _in_display(value: str, name: str, word: re.Pattern[str]) -> bool:
    """``[x, y]``, ``(x,)``, ``x, y``: a display that holds the name itself
    (iterating it, ``[t * 2 for t in x]``, makes new values)."""
    text = value.strip()
    if not (text[:1] in "[({" or "," in text.split("(", 1)[0]):
        return False
    return word.search(re.sub(rf"\bin\s+{re.escape(name)}\b", "", text)) is not None


