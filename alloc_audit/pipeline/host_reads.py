"""Stage 5, right after classify: device tensors a constructor or an
initialiser only reads back to the host (issue 11, round 18).

Input: classified sites and the project index. Output: the same sites, a
few T2 sites that classify tiered by the function's name re-tiered T4.

A constructor's ``torch.ones_like(x[:, 0]).cpu().numpy()`` (handed to
scikit-learn), or a local built from such tensors (``labels =
torch.cat((torch.ones_like(a), torch.zeros_like(b)))``) whose every use is
a host read (``labels.cpu()``, ``.numpy()``, ``.tolist()``, ``.item()``),
is dropped once the host copy is made: the device tensor dies with the
call, like any temporary (DESIGN.md, "Lifetime tiers": T4, one call). The
name speaks for what the function keeps; a tensor stored on the object,
returned, or used on the device keeps the name's tier. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import Site, Tier
from .index import Func, ProjectIndex
from .names import has_name
from .retier import Decision, python_device_site, retier

_BY_NAME = ("constructor ", "initialiser ")  # classify's name-based reasons (rules/tiers.toml)
_READS = ("cpu", "numpy", "tolist", "item")
_JOINS = ("torch.cat", "torch.stack", "torch.concat", "torch.concatenate")


def host_reads(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    def eligible(site: Site) -> bool:
        return python_device_site(site, Tier.T2) and site.tier_reason.startswith(_BY_NAME) \
            and site.kept in ("", "local")

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None:
            return None
        read = _read_in_chain(site, func) or _read_through_local(site, func)
        if not read:
            return None
        return Tier.T4, (f"a temporary: {site.scope} only reads it back to the host ({read}) and drops it; "
                         f"was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def _read_in_chain(site: Site, func: Func) -> str:
    """``torch.ones_like(x).cpu()``: a host read chained on the allocation."""
    for c in func.calls:
        if c.span.line == site.span.line and c.span.col == site.span.col and c.callee != site.api \
                and c.callee.rsplit(".", 1)[-1] in _READS:
            return f".{c.callee.rsplit('.', 1)[-1]}()"
    return ""


def _read_through_local(site: Site, func: Func) -> str:
    """The allocation is (part of) a local whose every later use is a host read."""
    local = (site.target or "").strip()
    if not local:
        join = next((c for c in func.calls if c.span.line == (site.stmt_line or site.span.line)
                     and c.callee in _JOINS and c.target and c.span.contains_line(site.span.line)), None)
        local = (join.target or "").strip() if join is not None else ""
    if not local.isidentifier():
        return ""
    stmt = site.stmt_line or site.span.line
    texts = [c.arglist for c in func.calls if c.span.line > stmt and c.arglist]
    texts += [c.callee for c in func.calls if c.span.line > stmt]
    texts += [a.value for a in func.assigns if a.line > stmt] + [r.value for r in func.returns]
    uses = 0
    for text in texts:
        at = _uses(text, local)
        if at is None:
            return ""
        uses += at
    return f"{local}.cpu()" if uses else ""


def _uses(text: str, name: str) -> int | None:
    """How many times ``text`` reads ``name`` back to the host; None when it
    uses it any other way."""
    if not has_name(text, name, "."):
        return 0
    count = 0
    at = text.find(name)
    while at >= 0:
        before = text[at - 1] if at > 0 else ""
        end = at + len(name)
        after = text[end] if end < len(text) else ""
        if not (before and (before.isalnum() or before in "_.")) and not (after.isalnum() or after == "_"):
            if not any(text.startswith(f".{r}(", end) or text == f"{name}.{r}" for r in _READS):
                return None
            count += 1
        at = text.find(name, at + 1)
    return count
