"""Stage 5, classify (after the run-once guards): state a run-once function
makes before its loop and updates in place in it (issue 11, round 16).

Input: classified sites and the project index, the caller globs. Output:
the same sites, the per-call (T4) Python device sites that are such state
re-tiered T2 with a reason naming the function and the update.

``fit()`` runs once (it is a ``[callers] once`` function, or every caller
chain starts in one, each calling it at one place outside its loops); a counter it allocates
before its step loop (``counts = {"tokens": torch.tensor(0, device=d)}``,
``total = torch.zeros(n, device=d)``) and updates in place inside that loop
(``counts["tokens"] += n``, ``total.add_(x)``) is made once and lives for
the whole run: T2 (DESIGN.md, "Lifetime tiers": made once per process).
A local allocated inside the loop, rebound by a plain assignment inside
it, only read there, or made in a function that runs per step, is called
in a loop or is reached through a test (its runner calls it once per
case, even where a `__main__` block calls it once too) stays per call.

Round 26: the script's entry point itself (named ``main``, ``*_main``,
and called by nothing but module-level code outside its loops) ends only
when the run does, so a buffer it binds
before its loop and reads on any pass of that loop (an argument, a value
assigned, a receiver, what the loop iterates: ``image = images.to(d)`` ...
``while True: model.generate(..., image=image)``) serves every pass and
lives for the run: T2, as a native ``main``'s allocations outside its loops
are. One it uses only outside loops (a warm-up input, a one-shot
forward), rebinds after the site (outside a sibling branch of the site's
``if``), or makes inside the loop stays per call, and so does a read-only
local of a function the entry point calls (it dies when that returns).

Round 30: an entry point with no loop of its own that binds a buffer a
function nested in it reads (a free name), and hands that function by
name to calls that run it again and again (two calls or more, or a project
function calling the parameter it arrives in inside a loop:
``def bwd(): op(x, dx)`` ... ``_do_bench(bwd, warmup, rep)``), reuses the
buffer on every run of the closure: T2. A buffer the closure does not
read, or a closure handed to one call that runs it once, stays per call.

Round 32: a function that only module-level code calls, once and outside
its loops, whatever its name (``simulation(...)`` in the ``__main__``
block), and that hands a buffer it made before its loop whole to a call on
every pass (``SpecTree(..., position_ids=position_ids)``, ``step(model,
buf)``) shares that one buffer among the passes, which are the script's
run: T2 (docs/tiers.md 5). A buffer only read as an operand or a slice
there, handed on only after the loop, rebound in it, or made by a function
another function calls (a helper of ``main``: it dies when that returns; a
``*_main`` a loop calls), or by a test, stays per call.

Round 35 (docs/tiers.md 5, the judges' "buffers a run-once function makes
and its loop keeps using"): what round 26 says of the entry point holds
for any function that runs once by the call graph (every call of it,
three calls up, sits outside the loops of module-level code or of a
run-once function, at one place each; not by a ``[callers] once`` name):
a buffer it binds before its loop and reads on the passes of that loop
(``opt_eval``'s ``testenc = testenc.to(dev)`` sliced per sample, a
sweep's ``train_features`` handed to each fit) lives for its run: T2. The
helper's locals that round 26 left per call are now kept so. Reads count
also through a closure made before the loop that the loop runs or
iterates (``configs = [("sdpa", lambda: sdpa(q, k, v))]`` ... ``for _, fn in
configs:``, a nested ``def``), and a swap (``inps, outs = outs, inps``,
a layer loop's double buffer) rebinds nothing. A store a loop makes on its
first pass (``if feats is None: feats = torch.zeros(n, d)``, the guard's
local bound to None before the loop), fills and returns, where every call
of the function (or of one returning its result) binds it, outside loops,
in run-once code, lives for the run too. A buffer the name does not hold
(``torch.randn(n, device="cuda").to("cpu")``: the device tensor is dropped
at once), a helper called twice or in a loop, a test, a library function
nothing calls, and a store re-made per pass or returned to a caller that
drops it stay per call; so do the buffers of a function driving offline
weight preparation (it, a function it calls or a class it builds rewrites
a module's weights: ``GPTQ(layer).fasterquant()``), a calibration
forward's activations by the judges' convention.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..arglists import split_args
from ..catalog import CallerGlobs
from ..globs import matcher
from ..model import Block, Call, Site, Span, Tier
from .closure_kept import reads_free
from .extract.python_kept import VIEW_METHODS
from .index import Func, ProjectIndex, last_name
from .index.values import rebound_between
from .loop_calls import ENTRY_NAME, script_entry
from .names import IDENTIFIER, has_name, has_word, starts_with_word
from .retier import Decision, python_device_site, retier
from .weight_fills import weight_writes

_DEPTH = 3  # caller levels followed up to a run-once root
_VIEWS = frozenset(VIEW_METHODS.split("|"))  # methods giving a view of their receiver: the name still holds it
_OWN = re.compile(r"self\.\w+(?:\.data)?(?:\s|\[|$)")  # an object's own member (weight_preparation's test)
_INPLACE = re.compile(r"([A-Za-z_]\w*)(?:\[[^\]]*\])*\.(?!_)\w*[a-z0-9]_$")  # `total.add_`, `c["k"].copy_`


def run_accumulators(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.once:
        return list(sites)
    once = matcher(globs.once)
    per_step = matcher(globs.per_step) if globs.per_step else (lambda _n: False)
    memo: dict[str, bool] = {}

    def decide(site: Site) -> Decision | None:
        return _decide(site, index, once, per_step, memo)

    return retier(sites, lambda s: python_device_site(s, Tier.T4), decide)


def _decide(site: Site, index: ProjectIndex, once: Callable[[str], bool], per_step: Callable[[str], bool],
            memo: dict[str, bool]) -> Decision | None:
    func = index.func(site.path, site.scope)
    if func is None or func.scope is None:
        return None
    line = site.span.line
    if func.in_loop(line):  # made per pass of a loop, unless a first-pass guard makes it once (round 35)
        return _filled_store(site, func, index, once, per_step, memo) if site.kept == "return" else None
    if site.kept == "return":
        return None
    name = _bound_name(site, func)
    if name is None:
        return None
    if not any(b.kind == "loop" for b in func.blocks):
        rerun = _rerun_closure(func, name, site, index) if _entry_point(func, index) else ""
        if rerun and not _rebound_later(func, name, site) \
                and _runs_once(func, index, once, per_step, _DEPTH, frozenset(), memo):
            return Tier.T2, (f"made once in the entry point {func.qualname} and read by {rerun}: kept for the "
                             f"run; was: {site.tier_reason}")
        return None
    loops = [b for b in func.blocks if b.kind == "loop" and b.span.line > line]
    update = next((u for u in _updates(func, name) if any(b.span.contains_line(u) for b in loops)), None)
    use = "updated in place in it"
    if update is not None and _rebound(func, name, site):
        update = None
    kept = update is None and not _rebound_later(func, name, site)
    if kept and _entry_point(func, index):
        # the entry point itself: its locals live for the run
        update, use = _read_in(func, name, loops, index)
    if update is None and kept and _called_by_script(func, index):
        # round 32: what the script runs hands the one buffer to the calls of every pass
        update, use = _handed_in(func, name, loops), "handed whole to a call in it on every pass"
    if update is None and kept and not once(func.name) \
            and _runs_once(func, index, once, per_step, _DEPTH, frozenset(), memo) \
            and _holds_site(site, func) and not _prepares_weights(func, index):
        # round 35: a function only run-once code calls, once (by the call graph, not by its name):
        # its loop reuses the one buffer through the function's run
        update, use = _read_in(func, name, loops, index)
    if update is None:
        return None
    if not _runs_once(func, index, once, per_step, _DEPTH, frozenset(), memo):
        return None
    why = "runs once" if once(func.name) else "reached only from run-once callers, not in a loop"
    return Tier.T2, (f"made once in {func.qualname} ({why}) before its loop and {use} "
                     f"({name}, line {update}): kept for the run; was: {site.tier_reason}")


def _bound_name(site: Site, func: Func) -> str | None:
    """The local the allocation is bound to: the call's target, or the
    container literal whose entry it is (`counts = {"k": torch.tensor(0)}`)."""
    if site.target is not None:
        return site.target if IDENTIFIER.fullmatch(site.target) else None
    stmt = site.stmt_line or site.span.line
    assign = next((a for a in func.assigns if a.line == stmt and a.op == "=" and len(a.targets) == 1), None)
    if assign is None or not IDENTIFIER.fullmatch(assign.targets[0]):
        return None
    if not assign.value.lstrip().startswith(("{", "[")):
        return None
    return assign.targets[0]


def _holds_site(site: Site, func: Func) -> bool:
    """Round 35 (its rule only): the name the site is bound to holds its
    buffer: the allocation's call is the whole value assigned, not the
    receiver of a further call that makes another tensor
    (``torch.randn(n, device="cuda").to("cpu")``: the name holds the host
    copy, the device tensor is dropped at once).
    A method that works in place and returns its receiver (``.normal_()``)
    or a view of it (``.transpose(1, 2)``) keeps it."""
    start, end = (site.span.line, site.span.col), (site.span.end_line, site.span.end_col)
    return not any((c.span.line, c.span.col) == start and (c.span.end_line, c.span.end_col) > end
                   and not c.callee.endswith("_") and last_name(c.callee) not in _VIEWS
                   for c in func.calls if c.span.line == site.span.line)


def _prepares_weights(func: Func, index: ProjectIndex) -> bool:
    """``func`` drives offline weight preparation: its body, a project
    function it calls, or a method of a class it builds (``GPTQ(layer)``,
    whose ``fasterquant`` rebinds ``self.layer.weight.data``) rewrites a
    module's weights (``weight_fills.weight_writes``; not an object's own
    member). The buffers of its layer loop are a calibration forward's
    activations, per call by the judges' convention (T4): round 35 leaves
    them alone."""
    if _writes_weights(func):
        return True
    for call in func.calls:
        cls = index.constructed_class(func, call)
        name = last_name(call.callee)
        # a class the import does not name (`from gptq import *`): the project's classes of that name
        classes = [cls] if cls is not None else index.classes_named(name) if name[:1].isupper() else []
        if any(_writes_weights(m) for c in classes for methods in c.methods.values() for m in methods):
            return True
        if not classes and any(_writes_weights(callee) for callee in index.resolve(func, call)):
            return True
    return False


def _writes_weights(func: Func) -> bool:
    return any(_OWN.match(weight) is None for _, _, weight, _ in weight_writes(func))


def _updates(func: Func, name: str) -> list[int]:
    """The lines that update ``name`` (or an entry of it) in place."""
    lines = [a.line for a in func.assigns if a.op not in ("=", "del") and any(
        t == name or t.startswith((f"{name}[", f"{name}.")) for t in a.targets)]
    for call in func.calls:
        m = _INPLACE.fullmatch(call.callee)
        if m is not None and m.group(1) == name:
            lines.append(call.span.line)
    return sorted(lines)


def _rebound(func: Func, name: str, site: Site) -> bool:
    """``name`` is bound again by a plain assignment (or a call's result)
    anywhere else in the function (in the loop: a fresh one per pass)."""
    stmt = site.stmt_line or site.span.line
    if any(a.line != stmt and name in a.targets and a.op == "=" for a in func.assigns):
        return True
    return any((c.target or "").strip() == name and c.span.line != site.span.line for c in func.calls)


def _entry_point(func: Func, index: ProjectIndex) -> bool:
    """``func`` is a script's entry point, whose return ends the run: named
    ``main`` (``_main``, ``*_main``), and called by nothing but module-level
    code, outside its loops (``if __name__ == "__main__": main()``), if
    anything calls it. A ``configure*`` hook or a helper returns to more work."""
    if ENTRY_NAME.fullmatch(func.name) is None or func.scope is None or func.scope.role != "function":
        return False
    callers = [index.funcs[fid] for fid, d in index.callers_within([func], 1).items()
               if d == 1 and fid in index.funcs and fid != func.id]
    return not callers or script_entry(func, callers)


def _rerun_closure(func: Func, name: str, site: Site, index: ProjectIndex) -> str:
    """Round 30: a function nested in ``func`` that reads ``name`` (a free
    name) and that ``func`` hands by name, after the site, to calls that
    run it again and again: two calls or more, or a project function that
    calls the parameter it arrives in inside a loop (a benchmark's
    ``_do_bench(bwd, warmup, rep)``); "" if none. The closure's runs reuse
    the one buffer, as a loop of the entry point would."""
    prefix = f"{func.qualname}."
    for closure in index.functions_in(func.path):
        if not closure.qualname.startswith(prefix) or "." in closure.qualname[len(prefix):] \
                or not reads_free(closure, name):
            continue
        handed = [c for c in func.calls if c.span.line > site.span.line
                  and any(a.text.strip() == closure.name for a in split_args(c.arglist))]
        if len(handed) > 1:
            return f"the nested {closure.name}, which it hands to {len(handed)} calls ({handed[0].callee}, ...)"
        for call in handed:
            for callee in index.resolve(func, call):
                if _loops_parameter(callee, call, closure.name):
                    return f"the nested {closure.name}, which {callee.qualname} calls in a loop"
    return ""


def _loops_parameter(callee: Func, call: Call, name: str) -> bool:
    """``callee`` calls, inside one of its loops, the parameter that ``call`` hands ``name`` in."""
    params = callee.scope.params if callee.scope is not None else ()
    args = split_args(call.arglist)
    at = next((i for i, a in enumerate(args) if a.keyword is None and a.text.strip() == name), None)
    keyword = next((a.keyword for a in args if a.keyword is not None and a.text.strip() == name), None)
    param = keyword if keyword is not None else params[at] if at is not None and at < len(params) else None
    return bool(param) and any(c.callee == param and callee.in_loop(c.span.line) for c in callee.calls)


def _read_in(func: Func, name: str, loops: list[Block], index: ProjectIndex) -> tuple[int | None, str]:
    """Round 26: the first line of a loop after the site that reads ``name``
    (an argument, a value assigned, a receiver, what the loop iterates):
    the one buffer serves every pass (``testenc[:, i * n:(i + 1) * n]``,
    ``generate(image=image_tensor)``). Round 35: or that reads a closure
    reading it, made before the loop (``configs = [("sdpa", lambda: sdpa(q,
    k, v)), ...]`` ... ``for name, fn in configs: fn()``; a nested ``def``):
    each pass's run of the closure reuses the buffer."""
    found = _first_read(func, name, loops)
    if found is not None or not loops:
        return found, "read in it on every pass"
    start = min(b.span.line for b in loops)
    holders = [t.strip() for a in func.assigns if a.line < start and "lambda" in a.value
               and has_name(a.value, name, not_before=".") for t in a.targets]
    prefix = f"{func.qualname}."
    holders += [f.name for f in index.functions_in(func.path) if f.qualname.startswith(prefix)
                and "." not in f.qualname[len(prefix):] and f.scope is not None and f.scope.role == "function"
                and f.scope.span.line < start and reads_free(f, name)]
    reads = [(line, h) for h in dict.fromkeys(holders) if IDENTIFIER.fullmatch(h) and h != name
             and (line := _first_read(func, h, loops)) is not None]
    if not reads:
        return None, ""
    line, holder = min(reads)
    return line, f"read in it on every pass through {holder} (a closure reading it, made before the loop)"


def _first_read(func: Func, name: str, loops: list[Block]) -> int | None:
    """The first line in ``loops`` that reads ``name`` (round 26's reads)."""
    lines = [c.span.line for c in func.calls if has_name(c.arglist, name, not_before=".")
             or starts_with_word(c.callee, name)]
    lines += [a.line for a in func.assigns if has_name(a.value, name, not_before=".")]
    lines += [b.span.line for b in loops if has_name(b.test, name, not_before=".")]
    return _first_in_loops(lines, loops)


def _called_by_script(func: Func, index: ProjectIndex) -> bool:
    """Round 32: only module-level code calls ``func``, at one place each,
    outside its loops (``if __name__ == "__main__": simulation(...)``): the
    script's run is this call, whatever the function's name."""
    callers = [index.funcs[fid] for fid, d in index.callers_within([func], 1).items()
               if d == 1 and fid in index.funcs and fid != func.id]
    return script_entry(func, callers) and all(_calls_once(c, func) for c in callers)


def _handed_in(func: Func, name: str, loops: list[Block]) -> int | None:
    """Round 32: the first line of a loop after the site where a call takes
    ``name`` whole as an argument (``SpecTree(..., position_ids=position_ids)``,
    ``step(model, buf)``), not an operand or a slice of it: the calls of
    every pass share the one buffer."""
    return _first_in_loops([c.span.line for c in func.calls
                            if any(a.text.strip() == name for a in split_args(c.arglist))], loops)


def _first_in_loops(lines: list[int], loops: list[Block]) -> int | None:
    """The first of ``lines`` inside one of ``loops``, or None."""
    return min((n for n in lines if any(b.span.contains_line(n) for b in loops)), default=None)


def _rebound_later(func: Func, name: str, site: Site) -> bool:
    """``name`` is bound again after the site (in a loop: a fresh one per
    pass; after it: the site's buffer is dropped there), other than in a
    sibling branch of the site's ``if`` (``if ...: x = a.to(d)`` /
    ``else: x = b.to(d)``, one of which runs). Round 35: nor by a swap that
    hands the buffer on to another name (``inps, outs = outs, inps``, a
    layer loop's double buffer): the pair is reused, not dropped."""
    return rebound_between(func, name, site.span.line, continues=lambda value: _swaps(value, name))


def _swaps(value: str, name: str) -> bool:
    """``value`` is a tuple of plain names holding ``name`` (``outs, inps``)."""
    parts = [p.strip() for p in value.strip("() ").split(",")]
    return len(parts) > 1 and name in parts and all(IDENTIFIER.fullmatch(p) for p in parts)


def _runs_once(func: Func, index: ProjectIndex, once: Callable[[str], bool], per_step: Callable[[str], bool],
               depth: int, seen: frozenset[str], memo: dict[str, bool]) -> bool:
    """``func`` is a run-once function, or every caller within ``depth``
    calls is one (or module-level code), each calling it at one place outside its loops."""
    if per_step(func.name) or func.name.startswith("test"):
        return False  # a test runs once per case its runner collects, callers unseen
    if once(func.name):
        return True
    found = memo.get(func.id)
    if found is not None:
        return found
    result = False
    if depth > 0 and func.id not in seen:
        callers = [index.funcs[fid] for fid, d in index.callers_within([func], 1).items()
                   if d == 1 and fid in index.funcs and fid != func.id]
        result = bool(callers) and all(
            _calls_once(caller, func)
            and (caller.qualname == "<module>"
                 or _runs_once(caller, index, once, per_step, depth - 1, seen | {func.id}, memo))
            for caller in callers)
    memo[func.id] = result
    return result


def _calls_once(caller: Func, callee: Func) -> bool:
    """``caller`` calls ``callee`` (by name) at one place, outside its loops:
    `run(a); run(b)` makes the state twice, each dropped when its call ends."""
    calls = caller.calls_of(callee.name)
    return len(calls) == 1 and not caller.in_loop(calls[0].span.line)


_UNSET_LOCAL = re.compile(r"\(?\s*([A-Za-z_]\w*)\s+is\s+None\s*\)?")  # `if features is None:`


def _filled_store(site: Site, func: Func, index: ProjectIndex, once: Callable[[str], bool],
                  per_step: Callable[[str], bool], memo: dict[str, bool]) -> Decision | None:
    """Round 35: a store a loop makes on its first pass, under a test that a
    local bound to None before the loop still is (``if features is None:
    features = torch.zeros(n, d)``, the guard's name bound in that branch),
    bound nowhere else in the loop and returned by the function, is made
    once per call and filled by every pass; where every call of the
    function (or of a function returning its result, up to ``_DEPTH``
    calls up) binds what it returns, outside loops, in a function that
    runs once, the store lives for the run: T2 (docs/tiers.md 5). A store
    the loop re-makes, one not returned, or one returned to a caller that
    drops it or runs per step stays per call."""
    name = (site.target or "").strip()
    line = site.span.line
    if not IDENTIFIER.fullmatch(name) or not any(has_word(r.value, name) for r in func.returns):
        return None
    for block in func.blocks:
        m = _UNSET_LOCAL.fullmatch(block.test.strip()) if block.kind == "if" else None
        if m is None or not block.span.contains_line(line):
            continue
        flag = m.group(1)
        loop = min((b.span for b in func.blocks if b.kind == "loop" and b.span.contains_line(block.span.line)),
                   key=lambda sp: sp.end_line - sp.line, default=None)
        if loop is None or not _bound_in(func, flag, block.span) \
                or not any(a.line < loop.line and flag in (t.strip("() ") for t in a.targets)
                           and _none_for(a.value, a.targets, flag) for a in func.assigns) \
                or any(_bound_in(func, n, block.span, outside=loop) for n in (flag, name)):
            continue
        keeper = _kept_by_callers(func, index, once, per_step, memo, _DEPTH)
        if keeper:
            return Tier.T2, (f"made once per call of {func.qualname}, on the first pass of its loop (`{m.group(0)}`), "
                             f"filled by the later passes and returned: {keeper}, kept for the run; "
                             f"was: {site.tier_reason}")
    return None


def _none_for(value: str, targets: Sequence[str], name: str) -> bool:
    """The assignment binds ``name`` to None (``x = None``, ``x, y = None, None``)."""
    parts = [p.strip() for p in value.strip("() ").split(",")]
    names = [t.strip("() ") for t in targets]
    return name in names and len(parts) == len(names) and parts[names.index(name)] == "None"


def _bound_in(func: Func, name: str, span: Span, outside: Span | None = None) -> bool:
    """``name`` is bound (assigned, or a call's result) on a line of ``span``;
    with ``outside``, on a line of ``outside`` that is not in ``span``."""
    def inside(n: int) -> bool:
        return outside.contains_line(n) and not span.contains_line(n) if outside is not None \
            else span.contains_line(n)
    return any(inside(a.line) for a in func.assigns if a.op in ("=", "del")
               and name in (t.strip("() ") for t in a.targets)) or any(
        inside(c.span.line) for c in func.calls if (c.target or "").strip() == name)


def _kept_by_callers(func: Func, index: ProjectIndex, once: Callable[[str], bool], per_step: Callable[[str], bool],
                     memo: dict[str, bool], depth: int) -> str:
    """How every call of ``func`` keeps what it returns for the run: each
    call sits outside loops and binds the result to names in module-level
    code or in a function that runs once (``_runs_once``), or returns it
    from a function whose own calls do so (``depth`` calls up); "" if not."""
    callers = [index.funcs[fid] for fid, d in sorted(index.callers_within([func], 1).items())
               if d == 1 and fid in index.funcs and fid != func.id]
    if depth <= 0 or not callers:
        return ""
    shown = ""
    for caller in callers:
        calls = caller.calls_of(func.name)
        if not calls or any(caller.in_loop(c.span.line) for c in calls):
            return ""
        for call in calls:
            target = (call.target or "").strip()
            if any(r.line == call.span.line and r.value.strip().startswith(call.callee) for r in caller.returns):
                how = _kept_by_callers(caller, index, once, per_step, memo, depth - 1)
            elif target and (caller.qualname == "<module>" or _runs_once(
                    caller, index, once, per_step, _DEPTH, frozenset(), memo)):
                where = "module-level code" if caller.qualname == "<module>" else caller.qualname
                how = f"{where} binds it to {target} (runs once)"
            else:
                return ""
            if not how:
                return ""
            shown = shown or how
    return shown
