"""Stage 5, for ``weight_preparation`` (issue 11; moved here in round 35
for size): the pass's memo (``PrepCtx``) and what it asks of a function's
calls: whether it runs a step (``runs_step``) or a forward
(``runs_forward``, ``feeds_forward``, ``forward_on_args``), whether a step
reaches it from its callers (``stepped``), and whether a caller hands it a
forward's output (``hands_forward_output``).

Round 35: a run-once caller (a script's module level, ``main``) that runs a
step reaches a writer through it only when some call on the way down sits in
one of its loops beside the step (``for batch in data: loss.backward();
ema.update(model)``); a script that quantises a model, then samples from it
(``model = convert(model)`` ... ``model.generate(ids)``), runs the writer once.
Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..globs import test_path
from ..model import Assign, Call, Language
from .conversion_paths import callers_of
from .index import Func, ProjectIndex, last_name
from .names import has_word
from .prep_shapes import calls_held, live_calls, patched_names, stepped_around, unpatched_constants

DEPTH = 4  # calls up from a writer, or from a helper to its writer
_RANDOM = ("random.", "numpy.random.", "np.random.")  # the standard library's and numpy's random draws


@dataclass
class PrepCtx:
    index: ProjectIndex
    per_step: Callable[[str], bool]
    once: Callable[[str], bool]
    writes: dict[str, str] = field(default_factory=dict)
    forward: dict[str, bool] = field(default_factory=dict)
    steps: dict[str, bool] = field(default_factory=dict)
    roots: dict[str, bool] = field(default_factory=dict)
    prep: dict[str, str | None] = field(default_factory=dict)
    callers: dict[str, list[Func]] = field(default_factory=dict)
    values: dict[str, list[str]] = field(default_factory=dict)
    handed: frozenset[str] | None = None  # names handed on as values (``_handed_on``)
    bound: dict[str, list[tuple[str, Assign]]] = field(default_factory=dict)  # `fn = self.helper`, by last name
    live: dict[str, list[Call]] = field(default_factory=dict)
    patched: frozenset[str] | None = None  # names some file binds as an attribute (``_constants``)
    modules: dict[str, bool] = field(default_factory=dict)  # ``default_device.is_module``'s memo
    all_callers: dict[str, list[Func]] = field(default_factory=dict)  # ``callers_of``'s answers
    named: dict[str, list[Func]] = field(default_factory=dict)  # ``callers_of``'s calls by name, per name
    outputs: dict[str, set[str]] = field(default_factory=dict)  # ``hands_forward_output``: a caller's outputs


def runs_step(func: Func, ctx: PrepCtx) -> bool:
    """``func`` has a per-step name or calls one (``loss.backward()``); not
    a random-number draw named like one (``random.sample(data, n)``, round 29)."""
    found = ctx.steps.get(func.id)
    if found is None:
        found = ctx.steps[func.id] = ctx.per_step(func.name) or any(steps(c, ctx) for c in live(func, ctx))
    return found


def steps(call: Call, ctx: PrepCtx) -> bool:
    return ctx.per_step(last_name(call.callee)) and not call.callee.startswith(_RANDOM)


def runs_forward(func: Func, ctx: PrepCtx) -> bool:
    """``func`` runs a step, or calls a value it holds: a parameter or local
    (``layer(x)``), or a ``self.x`` that is no method of its class."""
    found = ctx.forward.get(func.id)
    if found is None:
        found = ctx.forward[func.id] = runs_step(func, ctx) or any(
            calls_held(func, c.callee, ctx.index) for c in live(func, ctx))
    return found


def feeds_forward(func: Func, ctx: PrepCtx) -> bool:
    """``func`` runs a forward or a step, or calls a project function that
    does (``module_benchmark(mod, x)``): its own temporaries may be that
    forward's inputs."""
    key = f"feeds:{func.id}"
    found = ctx.forward.get(key)
    if found is None:
        found = ctx.forward[key] = runs_forward(func, ctx) or any(
            forward_on_args(g, ctx) for _, targets in ctx.index.callees(func) for g in targets
            if g.scope is not None and g.language is Language.PYTHON)
    return found


def forward_on_args(func: Func, ctx: PrepCtx, depth: int = 2) -> bool:
    """``func`` runs a step, or a forward on what it is handed: it calls a
    parameter (``module(x)``), a value it holds with a parameter in the
    arguments (``self.layer(x)``), or a project function doing so with a
    parameter in the arguments (``self._iter_forward(x, module)``, ``depth``
    calls down); not a forward on its own state (``self.layer(self.inp)``)."""
    key = f"args:{func.id}#{depth}"
    found = ctx.forward.get(key)
    if found is None:
        ctx.forward[key] = False  # a recursion adds nothing
        scope = func.scope
        params = {p.lstrip("*") for p in (scope.params if scope is not None else ())} - {"self", "cls"}
        found = runs_step(func, ctx) or any(
            c.callee in params or (calls_held(func, c.callee, ctx.index) and any(
                has_word(c.arglist, p) for p in params)) for c in live(func, ctx)) or (depth > 1 and any(
                    any(has_word(call.arglist, p) for p in params) and any(
                        g.scope is not None and forward_on_args(g, ctx, depth - 1) for g in targets)
                    for call, targets in ctx.index.callees(func)))
        ctx.forward[key] = found
    return found


def live(func: Func, ctx: PrepCtx) -> list[Call]:
    """``prep_shapes.live_calls``, memoised."""
    found = ctx.live.get(func.id)
    if found is None:
        if ctx.patched is None:
            ctx.patched = patched_names(ctx.index)
        found = ctx.live[func.id] = live_calls(func, unpatched_constants(ctx.index, func.path, ctx.patched))
    return found


def stepped(func: Func, ctx: PrepCtx) -> bool:
    """A caller within ``DEPTH`` calls up runs a step (``runs_step``), a
    run-once one only in a loop on the way down (``stepped_around``)."""

    def stepping(call: Call) -> bool:
        return steps(call, ctx)

    seen = {func.id}
    frontier = [func]
    for _ in range(DEPTH):
        nxt = []
        for f in frontier:
            for c in callers_up(f, ctx):
                if c.id in seen or test_path(c.path):
                    continue
                if runs_step(c, ctx) and not (runs_once(c, ctx) and not stepped_around(c, f.name, stepping)):
                    return True
                seen.add(c.id)
                nxt.append(c)
        frontier = nxt
    return False


def runs_once(func: Func, ctx: PrepCtx) -> bool:
    """A script's module level or a run-once function (``[callers] once``: ``main``)."""
    return func.qualname == "<module>" or (func.owner is None and ctx.once(func.name))


def callers_up(func: Func, ctx: PrepCtx) -> list[Func]:
    """``conversion_paths.callers_of``, once per function (``stepped`` walks up from many)."""
    found = ctx.all_callers.get(func.id)
    if found is None:
        found = ctx.all_callers[func.id] = callers_of(func, ctx.index, named=ctx.named)
    return found


def hands_forward_output(caller: Func, func: Func, ctx: PrepCtx) -> bool:
    """``caller`` hands ``func`` what a forward returned: a local bound to a
    call of a held value (``out = layer(x)``), of a per-step name, or of a
    project function running a forward on its arguments
    (``out = self._module_forward(x, module)``): ``func`` then works on the
    calibration forward's output (a loss), per call."""
    index = ctx.index
    outputs = ctx.outputs.get(caller.id)  # the caller's alone: asked again for each function it calls
    if outputs is None:
        outputs = ctx.outputs[caller.id] = {c.target.strip() for c in live(caller, ctx) if c.target and (
            calls_held(caller, c.callee, index) or ctx.per_step(last_name(c.callee)) or any(
                g.scope is not None and forward_on_args(g, ctx) for g in index.resolve(caller, c)))}
        outputs.discard("")
    return bool(outputs) and any(
        any(has_word(c.arglist, o) for o in outputs) for c in caller.calls if func in index.resolve(caller, c))
