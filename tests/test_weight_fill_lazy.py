"""weight_sinks asks ``_packs`` only where an own member is filled, and
gates its pattern by the literal every match holds; weight_fills'
``weight_writes`` builds a call's text only where a weight is rebuilt
(perf-r34f). Each must answer exactly as the eager code did:
compared with it on every function of the Python fixtures."""

from __future__ import annotations

from pathlib import Path

from fixtures_harness import extracted_facts

from alloc_audit.pipeline import weight_fills as wf
from alloc_audit.pipeline import weight_sinks as ws
from alloc_audit.pipeline.index import Func, ProjectIndex
from alloc_audit.pipeline.lazy_members import weight_member

FIXTURES = Path(__file__).parent / "fixtures" / "python"


def _funcs() -> list[Func]:
    paths = tuple(sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.py")))
    index = ProjectIndex(extracted_facts(FIXTURES, paths))
    index.settle()
    return sorted(index.funcs.values(), key=lambda f: f.id)


def _packs_before(func: Func) -> bool:
    scope = func.scope
    if scope is None or not [p for p in scope.params if p.lstrip("*") not in ("self", "cls")]:
        return False
    texts = [a.value for a in func.assigns] + [f"{c.callee}({c.arglist})" for c in func.calls]
    return any(m.group(1) != "self" for t in texts for m in ws._READ_WEIGHT.finditer(t))


def _sink_writes_before(func: Func) -> list[ws._Write]:
    """``sink_writes`` as round 32 wrote it (``_packs`` asked first, for every function)."""
    if func.name in ws._PER_CALL or ws._steps(func):
        return []
    stores = [(a.line, a.targets[0].strip(), a.value) for a in func.assigns if a.op == "=" and len(a.targets) == 1]
    stores += [(c.span.line, c.target.strip(), f"{c.callee}({c.arglist})") for c in func.calls if c.target]
    found: list[ws._Write] = []
    packs = _packs_before(func)
    for line, target, value in stores:
        if ws._OTHER.fullmatch(target):
            found.append((line, value, f"{target} (stored)", True))
            continue
        own = ws._OWN.fullmatch(target)
        if own and packs and weight_member(func, own.group(1)):
            found.append((line, value, f"{target} (its own weight)", True))
    for c in func.calls:
        own = ws._OWN_COPY.fullmatch(c.callee)
        if own and packs and weight_member(func, own.group(1)):
            found.append((c.span.line, c.arglist, f"{own.group(1)} (its own weight, in place: copy_)", False))
        elif c.callee == "setattr":
            args = ws.split_args(c.arglist)
            if len(args) == 3 and ws.re.match(r"\s*(?:[\w.]+\.)?Parameter\(", args[2].text):
                found.append((c.span.line, args[2].text, f"{args[0].text.strip()}.<{args[1].text.strip()}> "
                                                          f"(set as a parameter)", True))
    return found


def _weight_writes_before(func: Func) -> list[wf._Write]:
    found = []
    for a in func.assigns:
        if a.op == "=" and len(a.targets) == 1 and wf._REBOUND.fullmatch(t := a.targets[0].strip()) and (
                t.endswith(".data") or wf._PARAMETER.match(a.value)):
            found.append((a.line, a.value, f"{t} (rebuilt)", True))
    for c in func.calls:
        value = f"{c.callee}({c.arglist})"
        if wf._IN_PLACE.fullmatch(c.callee):
            weight, _, method = c.callee.rpartition(".")
            found.append((c.span.line, c.arglist, f"{weight} (in place: {method})", False))
        elif c.target and wf._REBOUND.fullmatch(t := c.target.strip()) and (
                t.endswith(".data") or wf._PARAMETER.match(value)):
            found.append((c.span.line, value, f"{t} (rebuilt)", True))
    return found


def test_lazy_answers_are_the_eager_ones() -> None:
    funcs = _funcs()
    assert len(funcs) > 500
    packing = written = sunk = 0
    for func in funcs:
        assert ws._packs(func) == _packs_before(func), func.id
        assert ws.sink_writes(func) == _sink_writes_before(func), func.id
        assert wf.weight_writes(func) == _weight_writes_before(func), func.id
        packing += _packs_before(func)
        written += bool(_weight_writes_before(func))
        sunk += bool(_sink_writes_before(func))
    assert packing and written and sunk  # the fixtures exercise each answer



def _load_hooks_before(func: Func, index: ProjectIndex) -> str:
    """``load_hook`` as round 32 wrote it: every function of the file turned into ``Call``s."""
    hooks: dict[str, str] = {}
    for other in index.functions_in(func.path):
        for c in other.calls:
            if c.callee.rpartition(".")[2] in ws._LOAD_HOOKS and c.arglist.strip():
                names = [n for n in ws.IDENTIFIER.findall(ws.split_args(c.arglist)[0].text)
                         if n not in ("self", "functools", "partial")]
                if names:
                    hooks.setdefault(names[0], f"{func.path}:{c.span.line}")
    return hooks.get(func.name, "")


def test_load_hook_read_from_the_columns_is_the_one_read_from_the_calls() -> None:
    """perf-r35b: ``load_hook`` reads the call columns; the same answer, first registration kept, for every
    function of the Python fixtures (in a fresh index: no ``Call`` built before it asks)."""
    paths = tuple(sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.py")))
    index = ProjectIndex(extracted_facts(FIXTURES, paths))
    memo: dict[str, dict[str, str]] = {}
    answers = {f.id: ws.load_hook(f, index, memo) for f in sorted(index.funcs.values(), key=lambda f: f.id)}
    hooked = 0
    for func in sorted(index.funcs.values(), key=lambda f: f.id):
        assert answers[func.id] == _load_hooks_before(func, index), func.id
        hooked += bool(answers[func.id])
    assert hooked  # the fixtures register a hook
