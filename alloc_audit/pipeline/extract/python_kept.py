"""Stage 3, extract (Python): where each allocation's memory goes.

``Site.kept`` is read from the allocation's scope: an attribute or a
container of an object (`self.x = buf`, `self.slots[i] = buf`,
`self.pool.append(buf)`, followed through one local and views of it), the
return value, a call it is handed to (a closure counts), nowhere (``local``:
a temporary that dies with the call), or "" when it cannot be told (another
name may hold it; a use the capped facts do not show in full). Classify
reads it: name patterns speak for what a function keeps, not for its
temporaries (rules/tiers.toml). Pure.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from ...arglists import split_args
from ...model import Assign, CallTable, Return, Site, SiteKind
from ..names import IDENTIFIER

if TYPE_CHECKING:
    from .python import PythonExtractor

# tensor methods that read it or compute a new tensor (not a view of it)
_READS = frozenset({"sum", "item", "all", "any", "tolist", "numel", "size", "dim", "max", "min", "mean", "norm",
                    "cpu", "clone", "float", "half", "int", "long", "bool", "argmax", "argmin", "abs", "nonzero",
                    "cumsum", "prod", "std", "var", "eq", "ne", "lt", "gt", "le", "ge", "isnan", "count_nonzero"})
# builtins that read a tensor and keep nothing of it
_READS_ONLY = frozenset({"int", "float", "bool", "len", "str", "repr", "print", "isinstance", "id", "hash", "type",
                         "min", "max", "sum", "abs", "round", "range", "enumerate", "zip", "format"})
_KEPT_PLACE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\[[^\]]*\])*|[A-Za-z_]\w*(?:\[[^\]]*\])+")
# a store into a slice (`x[:n] = buf`, `x[i, :n] = buf`): a copy of the values
_SLICE_STORE = re.compile(r"[A-Za-z_][\w.]*\[[^\]]*:[^\]]*\]")
_GETATTR_SELF = re.compile(r"^getattr\(\s*self\s*,\s*([A-Za-z_]\w*)\s*\)(?=\.)")
_CONTAINER_ADD = re.compile(r"^(?P<owner>[A-Za-z_][\w.]*)\.(?:append|extend|insert|add|setdefault|update|put)$")


def _escape(site: Site, assigns: list[Assign], returns: list[Return], call_ix: list[int], calls: CallTable,
            non_retaining: frozenset[str] = frozenset()) -> str:
    """Where a local allocation goes after its line: ``self.x`` (kept on an
    object or in its container), ``return``, ``handed:<callee>``, or
    ``local`` when it goes nowhere (a temporary). A call in
    ``non_retaining`` (`dist.all_reduce(buf)`, `dst.copy_(buf)`: the
    catalogue's ``[non-retaining]``) reads it and keeps nothing."""
    name = site.target or ""
    after = site.span.end_line
    aliased = False  # another name may hold it: where it goes is not told here
    for a in assigns:
        if a.op != "=" and a.value.strip() == name:
            continue  # `self.total += buf`: its values are added in place, the memory is not kept
        if a.line > after and _same_memory(a.value, name) and not _makes_new(a.value):
            # `table[:n] = buf`: its values are copied in, the memory is not kept
            held = [t.strip() for t in a.targets if not _SLICE_STORE.fullmatch(t.strip())]
            for t in held:
                if _KEPT_PLACE.fullmatch(t):
                    return t
            aliased = aliased or bool(held)
    for r in returns:
        if r.line >= site.span.line and _same_memory(r.value, name):
            return "return"
    handed = ""
    method = name + "."
    for i in call_ix:
        if calls.line(i) <= after:
            continue
        callee = calls.callees[i]
        on_it = callee.startswith(method) or (_receiver(callee) == name and "." in callee)
        if on_it and calls.targets[i] and callee.rsplit(".", 1)[-1] not in _READS \
                and not _to_host(site, calls, i, name):
            aliased = True  # `a, b = buf.split(...)`, `v = buf.view(...)`: views kept under other names
            continue
        if not _count_word(calls.arglists[i], name):
            continue
        args = [a.text.strip() for a in split_args(calls.arglists[i], False)]
        if any(_same_memory(arg, name) for arg in args):
            if callee in _READS_ONLY or callee in NEW_TENSOR or callee.rsplit(".", 1)[-1] in non_retaining:
                continue  # read (`torch.einsum("i,j->ij", t, f)` makes a new tensor) and dropped
            m = _CONTAINER_ADD.match(callee)
            if m is not None and "." in m.group("owner"):
                return f"{m.group('owner')}[]"
            handed = handed or f"handed:{callee}"
    if handed:
        return handed
    return "" if aliased else "local"


VIEW_METHODS = ("view|reshape|narrow|flatten|unflatten|unsqueeze|squeeze|transpose|permute|contiguous|as_strided"
                 "|t|T|detach|view_as")
_VIEW = r"(?:\.(?:" + VIEW_METHODS + r")\b(?:\([^()]*\))?|\[[^\]]*\])*"


VIEW_TAIL = re.compile(_VIEW + r"\s*")


def _count_word(text: str | bytes, name: str | bytes, start: int = 0, end: int | None = None) -> int:
    """How often ``name`` occurs in ``text[start:end]`` as a whole name that
    is not an attribute (`buf`, `buf.sum()`, `buf[0]`; not `self.buf`,
    `buffer`, `buf(`). A scan of the occurrences: no pattern per name."""
    stop = len(text) if end is None else end
    size = len(name)
    count = 0
    at = text.find(name, start, stop)  # type: ignore[arg-type]
    while at >= 0:
        before = text[at - 1:at] if at > 0 else b""
        after = text[at + size:at + size + 1]
        if not _is_name_char(before, dot=True) and not _is_name_char(after, paren=True):
            count += 1
        at = text.find(name, at + 1, stop)  # type: ignore[arg-type]
    return count


def _is_name_char(ch: str | bytes, dot: bool = False, paren: bool = False) -> bool:
    if not ch:
        return False
    c = ch if isinstance(ch, str) else ch.decode("latin-1")
    return c.isalnum() or c == "_" or (dot and c == ".") or (paren and c == "(")


def _same_memory(value: str, name: str) -> bool:
    """True when an expression (or one element of a tuple, list or dict) is
    ``name`` or a view of it (`buf`, `buf[:n]`, `buf.view(-1)`), not a new
    tensor computed from it (`buf.sum()`, `buf * 2`). Read with one search,
    no splitting: an element inside a call's arguments counts too, which
    errs on the side of "kept"."""
    at = value.find(name)
    while at >= 0:
        before = value[:at].rstrip()
        if not before or before[-1] in ",([{:":
            tail = VIEW_TAIL.match(value, at + len(name))
            end = tail.end() if tail is not None else at + len(name)
            if end >= len(value) or value[end] in ",)]}":
                return True
        at = value.find(name, at + 1)
    return False


_CALL_HEAD = re.compile(r"\s*([\w.]+)\(")


def _makes_new(value: str) -> bool:
    """The whole expression is one call of a torch function that makes a
    new tensor (`torch.einsum("i,j->ij", t, f)`): no argument is held."""
    m = _CALL_HEAD.match(value)
    return m is not None and m.group(1) in NEW_TENSOR and value.rstrip().endswith(")") \
        and value.count("(") == value.count(")") and not re.search(r"\)\s*[.\[]", value)


DEFAULT_DEVICE = "default"  # no device given: the default device where the call runs


class SourceIndex:
    """Line starts and scope ends of one file, computed on first use."""

    def __init__(self) -> None:
        self.line_starts: list[int] | None = None
        self.scope_ends: dict[str, int] = {}


def mark_kept(ext: PythonExtractor, sites: list[Site], assigns: list[Assign], returns: list[Return],
          calls: CallTable) -> list[Site]:
    """Where each allocation's memory goes (``Site.kept``), read from its
    scope: an attribute or container of an object (`self.x = buf`,
    `self.slots[i] = buf`, `self.pool.append(buf)`), the return value,
    a call it is handed to, or nowhere (``local``: a temporary that dies
    with the call). Followed through one local."""
    wanted = {s.scope for s in sites if s.target is None or IDENTIFIER.fullmatch(s.target)}
    if not wanted:
        return [_kept_direct(s) for s in sites]
    # the local names to follow, per scope: statements that never name
    # one are never looked at again (a long test function has thousands)
    names: dict[str, set[str]] = {}
    for site in sites:
        if site.target and IDENTIFIER.fullmatch(site.target) and not site.wrapper:
            names.setdefault(site.scope, set()).add(site.target)
    # per scope, its returns; per (scope, local name), the statements naming it
    scope_returns: dict[str, list[Return]] = {w: [] for w in wanted}
    by_name: dict[tuple[str, str], tuple[list[Assign], list[int]]] = {}
    # a nested function or lambda sees the local too (a closure)
    homes: dict[str, list[str]] = {}

    def owners(scope: str) -> list[str]:
        found = homes.get(scope)
        if found is None:
            parts = scope.split(".")
            found = homes[scope] = [w for w in (".".join(parts[:i]) for i in range(len(parts), 0, -1))
                                    if w in names]
        return found

    def entry(w: str, name: str) -> tuple[list[Assign], list[int]]:
        found = by_name.get((w, name))
        if found is None:
            found = by_name[(w, name)] = ([], [])
        return found

    for a in assigns:
        for w in owners(a.scope):
            text = f"{a.value} {' '.join(a.targets)}"
            for name in names[w]:
                if name in text:  # a substring test first: most statements name none of them
                    entry(w, name)[0].append(a)
    for r in returns:
        if r.scope in scope_returns:
            scope_returns[r.scope].append(r)
    callees, arglists = calls.callees, calls.arglists
    for i, scope in enumerate(calls.scopes):
        for w in owners(scope):
            head = _receiver(callees[i])
            for name in names[w]:
                if name in arglists[i] or head == name:
                    entry(w, name)[1].append(i)
    out = []
    for site in sites:
        site = _kept_direct(site)
        if site.kept or site.scope not in scope_returns:
            out.append(site)
            continue
        rets = scope_returns[site.scope]
        if site.target is None:
            if any(r.line == site.stmt_line for r in rets):
                site = dataclasses.replace(site, kept="local" if _moved_on(site, calls) else "return")
            out.append(site)
            continue
        if not IDENTIFIER.fullmatch(site.target) or site.scope not in names:
            out.append(site)
            continue
        named_assigns, named_calls = by_name.get((site.scope, site.target), ([], []))
        rebound = _rebound(site, named_assigns, named_calls, calls)
        if rebound is not None:  # `t = t.tolist()`: from there on the name holds something else
            named_assigns = [a for a in named_assigns if a.line <= rebound]
            rets = [r for r in rets if r.line < rebound]
            named_calls = [i for i in named_calls if calls.line(i) <= rebound]
        kept = _escape(site, named_assigns, rets, named_calls, calls, ext.apis.py_non_retaining)
        if kept == "local" and not _all_uses_seen(ext, site, named_assigns, rets, named_calls, calls, rebound):
            kept = ""  # a use the facts do not show in full (a long return, a capped argument list)
        out.append(dataclasses.replace(site, kept=kept))
    return out

def _rebound(site: Site, assigns: list[Assign], call_ix: list[int], calls: CallTable) -> int | None:
    """The first line after the allocation that binds its name to something
    that is not its memory, computed from it (`t = t.tolist()`, `t = t * 2`;
    not `t = t.to(dtype)`, which may return it, nor `t = other` in another
    branch), or None."""
    name = site.target or ""
    after = site.span.end_line
    # computed from the buffer itself (`t = t * 2`): on the buffer's own path, not another branch's value
    lines = [a.line for a in assigns if a.line > after and a.targets == (name,) and a.op == "="
             and _count_word(_STRINGS.sub('""', a.value), name) and not _same_memory(a.value, name)]
    lines += [line for i in call_ix if (line := calls.line(i)) > after and calls.targets[i] == name
              and calls.callees[i].startswith(name + ".") and (calls.callees[i][len(name) + 1:] in NOT_ITSELF
                                                              or _to_host(site, calls, i, name))]
    return min(lines, default=None)


_MOVE_ON = re.compile(r"\(.*\)\.(?:to|cuda)", re.S)


def _moved_on(site: Site, calls: CallTable) -> bool:
    """A pinned copy moved on at once (`t.pin_memory().to(device, non_blocking=True)`):
    what the expression gives is the device copy; the pinned one is dropped."""
    if site.kind is not SiteKind.PINNED_HOST:
        return False
    p = calls.positions
    at = [i for i in range(len(calls.callees)) if p[4 * i] == site.span.line and p[4 * i + 1] == site.span.col]
    inner = next((calls.callees[i] for i in at if calls.callees[i].endswith("pin_memory")), None)
    return inner is not None and any(
        calls.callees[i].startswith(inner) and _MOVE_ON.fullmatch(calls.callees[i][len(inner):]) is not None
        and (calls.callees[i].endswith("cuda") or _off_host(calls.arglists[i])) for i in at)


def _off_host(arglist: str) -> bool:
    """A move's arguments name a target that is not the CPU (`.to(device)`)."""
    return bool(arglist.strip()) and _HOST_ARG.match(arglist) is None


_HOST_ARG = re.compile(r"""\s*(?:device\s*=\s*)?(?:torch\.device\(\s*)?(['"])cpu\1""")


def _to_host(site: Site, calls: CallTable, i: int, name: str) -> bool:
    """`t = t.cpu()`, `t = t.to(device="cpu")` of a device allocation: a
    host copy, the device memory is dropped."""
    method = calls.callees[i][len(name) + 1:]
    return site.kind is SiteKind.DEVICE and (
        method == "cpu" or (method == "to" and _HOST_ARG.match(calls.arglists[i]) is not None))


_STRINGS = re.compile(r"""(['"])(?:\\.|(?!\1).)*\1""")
# methods whose result is never the tensor they are called on (`t.tolist()`,
# `t.sum()`); conversions (`t.to(...)`, `t.float()`, `t.cpu()`) may return it
NOT_ITSELF = _READS - {"cpu", "float", "half", "int", "long", "bool"}


def _receiver(callee: str) -> str:
    """The name a method call is made on, subscripts dropped
    (`buf[-1].item` -> `buf`)."""
    return callee.partition(".")[0].partition("[")[0]


def _all_uses_seen(ext: PythonExtractor, site: Site, assigns: list[Assign], returns: list[Return],
               call_ix: list[int], calls: CallTable, rebound: int | None = None) -> bool:
    """True when every later use of a local in the source of its scope (up
    to the line that binds the name anew) was among the (capped) texts the
    kept analysis read."""
    name = site.target or ""
    if ext.kept_memo.line_starts is None:
        ext.kept_memo.line_starts = [0] + [m.end() for m in re.finditer(b"\n", ext.src.data)]
        ext.kept_memo.scope_ends = {}
        for i, qual in enumerate(ext.qualnames):
            ext.kept_memo.scope_ends.setdefault(qual, ext.containers.ranges[i][1])
    starts = ext.kept_memo.line_starts
    begin = starts[site.span.end_line] if site.span.end_line < len(starts) else len(ext.src.data)
    end = ext.kept_memo.scope_ends.get(site.scope, len(ext.src.data))
    if rebound is not None and rebound < len(starts):
        end = min(end, starts[rebound])  # through the rebinding line, whose target is the new binding
    in_source = _count_word(ext.src.data, name.encode(), begin, end)
    in_source -= _header_reads(ext.src.data, name.encode(), begin, end)
    in_source -= _comment_mentions(ext.src.data, name.encode(), begin, end)
    seen = sum(_count_word(a.value, name) + sum(_count_word(t, name) for t in a.targets)
               for a in assigns if a.line > site.span.end_line)
    seen += sum(_count_word(r.value, name) for r in returns if r.line > site.span.end_line)
    for i in call_ix:
        if calls.line(i) > site.span.end_line:
            # `buf.sum()`, `buf[-1].item()`: a method of it or of an element
            seen += _count_word(calls.arglists[i], name) + (_receiver(calls.callees[i]) == name)
    if rebound is not None and not any(a.line == rebound and a.targets == (name,) for a in assigns):
        seen += 1  # `t = t.tolist()`: the call's target, which no call text holds
    return seen >= in_source

# a loop or test header: `for x in buf:`, `if i in buf[m]:`, `while buf.any():`
_HEADER = re.compile(rb"^[ \t]*(?:(?:async[ \t]+)?for[ \t][^\n]*?[ \t]in[ \t]|(?:el)?if[ \t]|while[ \t])"
                     rb"([^\n]*):[ \t]*(?:#[^\n]*)?$", re.M)


def _header_reads(data: bytes, name: bytes, begin: int, end: int) -> int:
    """How often ``name`` is read in ``for``/``if``/``while`` headers of
    ``data[begin:end]`` outside any call (`for b in buf:`,
    `if i in buf[m]:`): reads, not keeps, and no fact shows them. Uses
    inside a call's arguments or as its receiver are left to the calls."""
    if name not in data[begin:end]:
        return 0
    count = 0
    for m in _HEADER.finditer(data, begin, end):
        text = m.group(1)
        at = text.find(name)
        while at >= 0:
            before = text[at - 1:at] if at > 0 else b""
            tail = text[at + len(name):]
            depth = text[:at].count(b"(") - text[:at].count(b")")  # inside a call's arguments
            if (not _is_name_char(before, dot=True) and not _is_name_char(tail[:1], paren=True) and depth == 0
                    and not _CALLED.match(tail)):
                count += 1
            at = text.find(name, at + 1)
    return count


_CALLED = re.compile(rb"(?:\[[^\]]*\])*\.[A-Za-z_]\w*\s*\(")
_COMMENT = re.compile(rb"#[^\n]*")


def _comment_mentions(data: bytes, name: bytes, begin: int, end: int) -> int:
    """How often ``name`` occurs in comments of ``data[begin:end]`` (a use
    commented out, ``# f(buf)``): no use at all."""
    if data.find(b"#", begin, end) < 0:
        return 0
    return sum(_count_word(m.group(0), name) for m in _COMMENT.finditer(data, begin, end))


def _kept_direct(site: Site) -> Site:
    target = site.target
    if site.wrapper:
        # `self.pool.append(torch.zeros(n))`, `getattr(self, NAME).append(...)`: into an object's container
        m = _CONTAINER_ADD.match(_GETATTR_SELF.sub(r"self.\1", site.wrapper))
        if m is not None and "." in m.group("owner"):
            return dataclasses.replace(site, kept=f"{m.group('owner')}[]")
        return dataclasses.replace(site, kept=f"handed:{site.wrapper}")
    if target and not IDENTIFIER.fullmatch(target) and _KEPT_PLACE.fullmatch(target):
        return dataclasses.replace(site, kept=target)
    return site


# torch functions whose result is always a new tensor: an allocation passed
# to one is read and dropped
NEW_TENSOR = frozenset(f"torch.{n}" for n in (
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "pow", "outer", "polar", "cat",
    "concat", "stack", "matmul", "mm", "bmm", "sin", "cos", "tanh", "sigmoid", "abs", "clamp", "cumsum",
    "cumprod", "neg", "reciprocal", "square", "erf", "floor", "ceil", "round", "triu", "tril", "kron",
    "softmax", "logsumexp", "einsum", "tensordot", "inner", "dot", "addmm", "baddbmm"))
