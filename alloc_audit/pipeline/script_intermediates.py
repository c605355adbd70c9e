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
when the file is run as a script, not at import (once: T2). Pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex


def script_intermediates(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    out = []
    for site in sites:
        if site.scope == "<module>" and site.language is Language.PYTHON:
            func = index.func(site.path, "<module>")
            if func is not None and site.tier is Tier.T2 and site.kind is SiteKind.DEVICE and site.via is None \
                    and (dropped := _rebound_later(site, func)):
                site = dataclasses.replace(site, tier=Tier.T4, tier_reason=(
                    f"a script's intermediate: module-level {site.target} is {dropped}, and nothing kept it before"))
            elif func is not None and site.tier_reason == _AT_IMPORT and _in_main_block(site, func):
                site = dataclasses.replace(site, tier_reason=_IN_MAIN)
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


def _rebound_later(site: Site, func: Func) -> str:
    """How the module drops the tensor a plain name holds: ``rebound at line
    N`` (or ``deleted``) by a statement that runs whenever the site ran (in
    no block the site is outside of: not a sibling branch), with no alias,
    store or keeping call of the name in between; or ""."""
    name = (site.target or "").strip()
    if not name.isidentifier():
        return ""
    line = site.stmt_line or site.span.line
    end_line = site.span.end_line
    enclosing = [b for b in func.blocks if b.span.contains_line(line)]
    later: list[tuple[int, str]] = []
    for a in func.assigns:
        if a.line > end_line and name in a.targets and a.op in ("=", "del"):
            later.append((a.line, "deleted" if a.op == "del" else f"rebound at line {a.line}"))
    later += [(c.span.line, f"rebound at line {c.span.line}") for c in func.calls
              if c.span.line > end_line and (c.target or "").strip() == name]
    for at, how in sorted(later):
        if any(b.span.contains_line(at) and b not in enclosing for b in func.blocks):
            continue  # in a branch or loop the site is not in: may not run
        word = re.compile(rf"\b{re.escape(name)}\b")
        for a in func.assigns:
            if line < a.line < at and word.search(a.value) and (
                    a.value.strip() == name or any(not t.isidentifier() for t in a.targets)
                    or _in_display(a.value, name, word)):
                return ""  # aliased, stored on an object or in a display
        for c in func.calls:
            if line < c.span.line <= at and _KEEPS.search(c.callee) and word.search(c.arglist):
                return ""
        return how
    return ""




def _in_display(value: str, name: str, word: re.Pattern[str]) -> bool:
    """``[x, y]``, ``(x,)``, ``x, y``: a display that holds the name itself
    (iterating it, ``[t * 2 for t in x]``, makes new values)."""
    text = value.strip()
    if not (text[:1] in "[({" or "," in text.split("(", 1)[0]):
        return False
    return word.search(re.sub(rf"\bin\s+{re.escape(name)}\b", "", text)) is not None


