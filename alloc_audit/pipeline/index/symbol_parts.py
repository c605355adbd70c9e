"""Pieces of ``symbols``, apart for its size: a new file's calls, sites
and statements filed into its functions, a Python class's constructors, and
the file of a dotted module (``Symbols.module_path``, with its choice
between vendored copies)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .symbols import ClassInfo, Func, Symbols


def statements_into_functions(symbols: Symbols, path: str) -> None:
    """A new file's calls, sites and statements into its functions."""
    facts = symbols.files[path]
    table = symbols.by_path[path]
    func_for = symbols._func_for
    calls = facts.calls
    last = None
    ix: list[int] = []
    for i, scope_name in enumerate(calls.scopes):
        if scope_name != last:  # a function's calls come in runs: its function looked up once a run
            func = table.get(scope_name) or func_for(table, path, scope_name, facts)
            func.table = calls
            ix = func.call_ix
            last = scope_name
        ix.append(i)
    for site in facts.sites:
        func_for(table, path, site.scope, facts).sites.append(site)
    for assign in facts.assigns:
        func_for(table, path, assign.scope, facts).assigns.append(assign)
    for ret in facts.returns:
        func_for(table, path, ret.scope, facts).returns.append(ret)
    for block in facts.blocks:
        func_for(table, path, block.scope, facts).blocks.append(block)
    for w in facts.withs:
        func_for(table, path, w.scope, facts).withs.append(w)


def module_file(symbols: Symbols, module: str, near: str) -> str | None:
    """``Symbols.module_path`` past noting the lookup: the module itself, else the one module that ends
    in it, else the copy that shares the most leading directories with ``near``."""
    found = symbols.modules.get(module)
    if found is not None:
        return found
    # the modules that end in a tail, kept until the next ``add`` (which changes ``modules_by_leaf`` and
    # clears them): resolutions ask ~5,500 tails ~57,000 times a scan of aphrodite, most between two adds,
    # and each ask scanned the leaf's modules again (32 of them for `utils`, `config`)
    candidates = symbols.module_tails.get(module)
    if candidates is None:
        suffix = "." + module
        candidates = symbols.module_tails[module] = [
            m for m in symbols.modules_by_leaf.get(module.rsplit(".", 1)[-1], ()) if m.endswith(suffix)]
    if len(candidates) == 1:
        return symbols.modules[candidates[0]]
    if not candidates or not near:
        return None
    shared = [(shared_dirs(symbols.modules[m], near), m) for m in candidates]
    best = max(n for n, _m in shared)
    winners = [m for n, m in shared if n == best]
    return symbols.modules[winners[0]] if len(winners) == 1 and best > 0 else None


def shared_dirs(a: str, b: str) -> int:
    """How many leading directories two relative paths share."""
    n = 0
    for x, y in zip(a.split("/")[:-1], b.split("/")[:-1]):
        if x != y:
            break
        n += 1
    return n


def python_constructors(symbols: Symbols, cls: ClassInfo, names: tuple[str, ...]) -> list[Func]:
    """``Symbols.method_lookup`` of each constructor name of a Python class, concatenated: its own
    method, else the nearest base's, with the bases found once for all names, not once a name (the
    same lookups, so the same names noted; a Python class's bases are Python classes: nothing native
    to note)."""
    out: list[Func] = []
    bases: list[ClassInfo] | None = None
    for name in names:
        found = cls.methods.get(name)
        if not found:
            if bases is None:
                bases = symbols.base_classes(cls)
            found = next((b.methods[name] for b in bases if b.methods.get(name)), [])
        out += found
    return out
