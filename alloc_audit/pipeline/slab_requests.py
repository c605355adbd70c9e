"""Evidence for ``slab_caches`` (round 31, docs/tiers.md section 1): whether a
member a class keeps is a slab requests fill, and whether a construction
whose allocation is such a slab also uploads weights.

Input: a site and the project index (a class and a member name for
``request_slab``). Output: a reason ("" or None when the rule does not
hold). The rule: the class's methods write the member in place at positions
(a slice that starts elsewhere than 0, an index that is no literal: true
for ``self.kv_cache[:bsz, start_pos:end_pos] = kv``), read it back, and
either place the write by the method's parameters or reset the member in
place (``zero_``); false for a CUDA graph's static input written by a prefix
(``self.ids[: n].copy_(ids)``), a queue placed by a counter the object keeps
and never reset, a vector of one length per request. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..arglists import split_args
from ..model import Site, Tier
from .index import ClassInfo, Func, ProjectIndex
from .names import IDENTIFIER, SELF_MEMBER
from .retier import Decision

DEPTH = 3  # constructors followed down from a construction (slab_caches follows as many)


def uploads_weights(site: Site, index: ProjectIndex, uploads: set[tuple[str, int, int]]) -> str:
    """Where the construction's constructors (followed ``DEPTH`` calls down) upload weights: a direct
    site ``weight_members`` or another pass found a weight upload ("" when none)."""
    found = index.site_call(site)
    if found is None:
        return ""
    func, call = found
    for ctor in index.resolve(func, call):
        if ctor.name != "__init__":
            continue
        for reach in index.reach(ctor, DEPTH):
            at = reach.site
            if (at.path, at.span.line, at.span.col) in uploads:
                return f"{at.path}:{at.span.line}"
    return ""


HANDED = "model parameter or buffer ("  # the classifier's reason for a buffer handed to `register_buffer`
MOVED_BACK = "module state moved in place: "  # self_moves' reason: a registered member's moved copy stored back
_REGISTER = re.compile(r"(?:^|\.)register_buffer$")
_STRING = re.compile(r"""\s*(?:'([A-Za-z_]\w*)'|"([A-Za-z_]\w*)")\s*""")
_RESETS = ("zero_", "fill_")
_NO_READS = (*_RESETS, "copy_")  # in-place verbs on the member that read nothing back
_INT = re.compile(r"-?\d+|\.\.\.|None")
_WORD = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\b")


def registered_slab(site: Site, index: ProjectIndex, per_request: Callable[[ClassInfo, str, bool], str]) -> \
        Decision | None:
    """A buffer a constructor registers by a literal name (``self.register_buffer("k_cache", torch.zeros(...))``)
    that the class's methods fill as a per-request slab (``request_slab``): T3, not module state; and so is
    the moved copy a method stores back into it (``self.k_cache = self.k_cache.to(x.device)``). Round 31."""
    func = index.func(site.path, site.scope)
    if func is None or func.owner is None or func.scope is None or not planar(site, index):
        return None
    kept = SELF_MEMBER.fullmatch((site.target or "").strip())
    if site.tier_reason.startswith(MOVED_BACK) and kept is not None:
        how = per_request(func.owner, kept.group(1), False)
        if not how:
            return None
        return Tier.T3, (f"pooled: {func.owner.name} keeps a slab in self.{kept.group(1)} (stored back by "
                         f"{site.scope}): {how}; was: {site.tier_reason}")
    for call in func.calls:
        if _REGISTER.search(call.callee) and call.callee.startswith("self.") and call.span.contains(site.span) \
                and call.span != site.span:
            args = split_args(call.arglist)
            named = _STRING.fullmatch(args[0].text) if args else None
            if named is None:
                return None
            member = named.group(1) or named.group(2)
            how = per_request(func.owner, member, False)
            if not how:
                return None
            return Tier.T3, (f"pooled: {func.owner.name} keeps a slab in self.{member} (registered by {site.scope}): "
                             f"{how}; was: {site.tier_reason}")
    return None


_FACTORIES = re.compile(r"torch\.(?:zeros|ones|empty|full|rand|randn|randint)")


def planar(site: Site, index: ProjectIndex) -> bool:
    """The buffer has more than one dimension, or its shape cannot be told: a slab holds
    features per position. A vector (``torch.zeros(batch).int().to(d)``: one length or page count
    per request, written ``[request_id] = seq_len``) is a descriptor of the pool, not the pool
    (docs/tiers.md section 1)."""
    shape = list(site.shape)
    func = index.func(site.path, site.scope)
    if not shape and func is not None:  # a move: the factory it moves, inside its span
        made = [c for c in func.calls if site.span.contains(c.span) and _FACTORIES.fullmatch(c.callee)]
        if len(made) == 1:
            shape = [a.text.strip() for a in split_args(made[0].arglist) if a.keyword is None]
            if len(shape) == 1 and shape[0].startswith(("(", "[")):
                shape = [a.text for a in split_args(shape[0][1:-1]) if a.text.strip()]
    if len(shape) != 1:
        return True
    name = shape[0].strip()
    if func is not None and IDENTIFIER.fullmatch(name):  # `torch.zeros(cache_shape)`: a local bound to a tuple
        if func.scope is not None and name in func.scope.params:
            return True  # a shape handed in: cannot be told
        bound = [a.value.strip() for a in func.assigns if a.op == "=" and name in (t.strip() for t in a.targets)]
        if bound and all(v.startswith(("(", "[")) and "," in v for v in bound):
            return True
    return False


def entries_list(site: Site, index: ProjectIndex) -> bool:
    """The member the site is kept in holds a list of such buffers (``self.k = [torch.zeros(...) for _ in
    range(n)]``): its first subscript picks an entry, only the next ones are positions."""
    func = index.func(site.path, site.scope)
    line = site.stmt_line or site.span.line
    return func is not None and any(a.line == line and a.op == "=" and a.value.lstrip().startswith("[")
                                    for a in func.assigns)


def _subscripts(text: str, heads: set[str]) -> list[str] | None:
    """The subscripts (inner texts) of ``text`` after one of ``heads`` (``self.k[i][:, a:b]`` -> ``["i", ":, a:b"]``),
    or None when ``text`` is not one of the heads subscripted."""
    text = text.strip()
    for head in heads:
        if text.startswith(head + "["):
            rest = text[len(head):]
            groups: list[str] = []
            while rest.startswith("["):
                depth, end = 0, -1
                for i, ch in enumerate(rest):
                    depth += ch in "[({"
                    depth -= ch in "])}"
                    if depth == 0:
                        end = i
                        break
                if end < 0:
                    return None
                groups.append(rest[1:end])
                rest = rest[end + 1:].lstrip()
            return groups if not rest else None
    return None


def _positions(groups: list[str]) -> set[str]:
    """The names a write's subscripts place it by (a slice's start that is no literal, an index that is
    no literal: ``[:bsz, start_pos:end_pos]`` -> ``{"start_pos"}``, ``[:, :, input_pos]`` -> ``{"input_pos"}``);
    empty for a prefix (``[:n]``) or a literal index."""
    names: set[str] = set()
    for group in groups:
        for element in split_args(group):
            text = element.text.strip()
            start = text.split(":", 1)[0].strip() if ":" in text else text
            if start and not _INT.fullmatch(start):
                names |= {w for w in _WORD.findall(start) if w != "self"} or {start}
    return names


def request_slab(owner: ClassInfo, member: str, entries: bool) -> str:
    """How the methods of ``owner`` use ``self.member`` as a slab requests fill in place ("" when they do not):
    a method writes it at positions (a slice that starts elsewhere than 0, an index that is no literal;
    directly or through a local bound to it: ``k_out = self.k_cache`` ... ``k_out[:, :, input_pos] = k``;
    assigned or ``copy_``-ed; an ``index_put_`` by index tensors, an embedding row cache's, is no position
    range), some method reads it back, and either a write's position comes from the method's parameters
    (the caller says where this request's tokens go: ``start_pos``, ``input_pos``, ``layer_idx``) or a
    method resets it in place (``zero_``) between requests (the whole member, or a whole entry, zeroed:
    a range filled is padding). For a member holding a list of buffers
    (``entries``), its first subscript picks an entry (``self.k[i] = x`` replaces one): only the deeper
    subscripts are positions. A prefix write (``self.ids[:n] = ids``, a CUDA graph's static input), a
    whole ``copy_``, a position kept on the object (``self.queue[:, ptr:ptr + n] = k`` with ``ptr`` read
    from a counter the class keeps) without a reset, and a member never read back are no slab. Round 31."""
    head = f"self.{member}"
    wrote = read = reset = ""
    by_caller = False
    for name, methods in sorted(owner.methods.items()):
        for method in methods:
            scope = method.scope
            if scope is None or scope.role == "constructor":
                continue
            heads = {head} | {a.targets[0].strip() for a in method.assigns if a.op == "=" and len(a.targets) == 1
                              and a.value.strip() == head and IDENTIFIER.fullmatch(a.targets[0].strip())}
            given = {p.lstrip("*").split(":", 1)[0].strip() for p in scope.params} - {"self", "cls"}
            given |= {t.strip() for a in method.assigns if a.op == "=" for t in a.targets
                      if IDENTIFIER.fullmatch(t.strip()) and any(w in given for w in _WORD.findall(a.value))}
            writes: list[tuple[int, set[str]]] = []
            # stores: an assignment's targets, or a call's whose value is the whole right-hand side
            stores = [(a.line, t) for a in method.assigns if a.op == "=" for t in a.targets]
            stores += [(c.span.line, c.target) for c in method.calls if c.target]
            for line, t in stores:
                groups = _subscripts(t, heads)
                if groups and (len(groups) > 1 or not entries):
                    writes.append((line, _positions(groups[1:] if entries else groups)))
            for c in method.calls:
                root, _, verb = c.callee.rpartition(".")
                groups = _subscripts(root, heads)
                # a reset empties the whole member, or (a list) a whole entry; a range filled is a write
                if verb in _RESETS and (root in heads or entries and groups is not None and len(groups) == 1):
                    reset = reset or f"{name} resets it in place (line {c.span.line})"
                elif verb == "copy_" and groups and (len(groups) > 1 or not entries):
                    writes.append((c.span.line, _positions(groups[1:] if entries else groups)))
            for line, names in writes:
                if names and not wrote:
                    wrote = f"{name} writes it at positions in place (line {line})"
                if names & given:
                    by_caller = True
                    wrote = f"{name} writes it at positions its caller gives (line {line})"
            if not read:
                read = _read_back(method, name, heads, {line for line, _ in writes})
    if not wrote or not read or not (by_caller or reset):
        return ""
    return f"{wrote}, {read}" + (f", {reset}" if reset else "")


def _read_back(method: Func, name: str, heads: set[str], writes: set[int]) -> str:
    """Where ``method`` reads the member (one of ``heads``) back: a value, a return or a call's argument
    other than its own writes ("" when it does not)."""
    verbs = "|".join(_NO_READS)
    word = re.compile("|".join(rf"(?<![\w.]){re.escape(h)}\b(?!\s*\.\s*(?:{verbs}|shape|size)\b)"
                               for h in sorted(heads)))
    for a in method.assigns:
        if a.op == "=" and a.line not in writes and a.value.strip() not in heads and word.search(a.value):
            return f"{name} reads it back (line {a.line})"
    for r in method.returns:
        if word.search(r.value):
            return f"{name} returns it (line {r.line})"
    for c in method.calls:
        if c.span.line not in writes and word.search(c.arglist):
            return f"{name} hands it to {c.callee} (line {c.span.line})"
        root, _, verb = c.callee.rpartition(".")
        if verb not in _NO_READS and (root in heads or _subscripts(root, heads)):
            return f"{name} reads it back (line {c.span.line})"  # `self.k[i][:, :n].unsqueeze(1)`
    return ""
