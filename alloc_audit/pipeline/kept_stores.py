"""Where a local ends up on an object: the member a later statement of the
same function stores it in, directly or packed into a bundle first (used by
``lifetimes``: a pinned buffer kept on an object outlives the call). Pure."""

from __future__ import annotations

import re

from .index import Func

MEMBER = re.compile(r"[A-Za-z_]\w*(?:\[[^\]]*\])*\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[[^\]]*\])*")
ADD = re.compile(r"(.+)\.(?:append|extend|insert|add)")


def stored_later(caller: Func, name: str, line: int, hops: int = 2) -> str:
    """The member a statement after ``line`` stores the local ``name`` in
    (``self.x = name``, ``self.parts.append(name)``), also through one local
    that packs it with others (``cur = (a, name)`` ... ``cls.cache[k] = cur``)."""
    for a in caller.assigns:
        if a.line <= line:
            continue
        value = a.value.strip()
        if value == name:
            member = next((t for t in a.targets if MEMBER.fullmatch(t)), "")
            if member:
                return member
        elif hops > 1 and len(a.targets) == 1 and a.targets[0].isidentifier() and value[:1] in ("(", "[") \
                and name in {part.strip() for part in value[1:-1].split(",")}:
            found = stored_later(caller, a.targets[0], a.line, hops - 1)
            if found:
                return found
    for c in caller.calls:
        if c.span.line > line and c.arglist.strip() == name and \
                (m := ADD.fullmatch(c.callee)) is not None and MEMBER.fullmatch(m.group(1)):
            return m.group(1)
    return ""
