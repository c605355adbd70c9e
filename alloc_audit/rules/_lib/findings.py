"""Building findings the same way in every rule: the stable key (what SARIF
fingerprints and suppressions follow), the call path as related locations,
and which site kinds count as device allocations."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ...arglists import split_top_level
from ...model import Finding, Related, Severity, Site, SiteKind, key_text
from ...pipeline.index import Func, Hop

# Kinds that acquire device memory (pinned host memory, pools, plan
# reservations and releases do not).
DEVICE_KINDS = frozenset({SiteKind.DEVICE, SiteKind.MANAGED, SiteKind.IPC, SiteKind.VIRTUAL})


def is_device_allocation(site: Site) -> bool:
    return site.kind in DEVICE_KINDS and site.via is None


def hop_notes(hops: Iterable[Hop]) -> tuple[Related, ...]:
    return tuple(Related(h.path, h.call.span.line, f"{h.caller} calls {h.call.callee} -> {h.callee}") for h in hops)


def path_text(hops: Iterable[Hop], last: str) -> str:
    names = [h.call.callee for h in hops]
    return " -> ".join([*names, last]) if names else last


def site_finding(rule: str, severity: Severity, site: Site, message: str,
                 related: tuple[Related, ...] = ()) -> Finding:
    return Finding(
        rule=rule,
        severity=severity,
        path=site.path,
        line=site.span.line,
        col=site.span.col,
        scope=site.scope,
        message=message,
        related=related,
        key=f"{rule} {key_text((site.path, site.scope, site.api))}",
        stmt_line=site.stmt_line,
    )


def finding_at(rule: str, severity: Severity, path: str, line: int, col: int, scope: str, subject: str,
               message: str, related: tuple[Related, ...] = (), stmt_line: int = 0) -> Finding:
    return Finding(
        rule=rule,
        severity=severity,
        path=path,
        line=line,
        col=col,
        scope=scope,
        message=message,
        related=related,
        key=f"{rule} {key_text((path, scope, subject))}",
        stmt_line=stmt_line or line,
    )


# Factories that make buffers (as opposed to data: randn, arange, tensor).
_DATA_APIS = re.compile(r"(?:^|[.:])(?:rand|randn|randint|randperm|arange|linspace|eye|tensor|as_tensor|from_numpy|"
                        r"array|asarray|rand_like|randn_like|randint_like|new_tensor)$")


def is_buffer_allocation(site: Site) -> bool:
    """A device allocation that makes an empty/filled buffer, not data."""
    return is_device_allocation(site) and _DATA_APIS.search(site.api) is None


_TENSOR_FACTORY = re.compile(r"^(?:torch\.|Tensor[.:]|at::|torch::|cupy\.|c10::)")


def returned_names(func: Func) -> set[str]:
    """Names a function returns: the items of a returned tuple or list, both
    branches of a conditional, any name with ``out`` in it that the return
    expression passes on (``return op(output, x)``: kernels return their
    output argument), and ``out``-named parameters (an optional output the
    function allocates when the caller passed none)."""
    names: set[str] = set()
    for r in func.returns:
        value = r.value.strip()
        for item in split_top_level(value.strip("()[]")):
            item = item.strip().strip("()[] ")
            branches = _CONDITIONAL.fullmatch(item)
            if branches is not None:
                names.update(b.strip("() ") for b in branches.groups())
            else:
                names.add(item)
        names.update(n for n in _IDENTIFIER.findall(value) if "out" in n.lower())
    # an optional out-argument filled in when the caller passed none
    # (`if out_indices is None: out_indices = torch.empty(...)`) is the output
    scope = func.scope
    if scope is not None and any(r.value for r in func.returns):
        names.update(p.split("=")[0].split(":")[0].strip().lstrip("*") for p in scope.params
                     if "out" in p.lower())
    return names


_CONDITIONAL = re.compile(r"(.+?)\s+if\s+.+?\s+else\s+(.+)", re.S)
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def is_returned(func_sites_returns: tuple[set[int], set[str]], site: Site) -> bool:
    """Whether a site's memory is its function's result (an op's output)."""
    lines, names = func_sites_returns
    return site.stmt_line in lines or site.span.line in lines or (site.target is not None and site.target in names)


def is_tensor_factory(site: Site) -> bool:
    """Caching-allocator tensors (torch, ATen, cupy), as opposed to raw
    driver allocations, which are never legal during stream capture."""
    return _TENSOR_FACTORY.match(site.api) is not None
