"""Stage 5, after the callers' tiers: a class built only in per-call code
keeps its constructor's buffers per call (issue 11, round 19).

A constructor's state lives as long as the object, and the object lives
where it is built. When every construction of a class (the calls of its
constructors, one call up) sits in a plain function or method, not in a
constructor nor at module level, and each of those is a per-step function
or is reached from one within two calls (or only tests call it) (``myreq = Request(group, device)``
in ``alltoall_pooled``, which a dist module's ``forward`` calls, then hands
the request out to be awaited), the object is a per-call value (an
awaitable, a request) and what its constructor allocates is per call: T4,
not the constructor's T2. A pinned host buffer its constructor makes is
pinned again with each object: staging per call, T5a, not the
constructor's T5b (round 23: a chunk of an activation offloaded per
forward and backward). A class also built in a constructor, at module
level, by a ``cls(...)`` factory, or in a function no per-step function
reaches, or kept by its builder (stored on an object or in a container,
handed to another class's constructor) keeps T2; an entry of a list or
dict the building function makes itself and never hands on whole
(``chunks[0] = Chunk(...)``) is no keeping: it dies with the call.

Round 23: nor is an attribute of an object the building function makes
itself and never stores elsewhere (``target = Instances(size)`` ...
``target.gt_keypoints = Keypoints(k)``; ``return target``): the object
lives as that holder does, like an object returned. A method of the class
that returns a copy of its object (``return Keypoints(self.tensor[i])``
in ``__getitem__``) and a test building it say nothing of its lifetime:
the other builders decide (none left: not per call).

Round 24: an object handed to the constructor of a class that is itself
built per call (``lb = LocalBlend(...)``; ``AttentionRefine(..., local_blend=lb)``
in a method ``generate`` runs) lives as that holder does: no keeping. A
subclass nothing builds (no call of its constructors, no ``cls(...)``
factory, its name read nowhere outside its own methods: not held in a
table nor handed on) is no evidence about its base, and its own
constructor's buffers live as its siblings' do: per call when its project
base is built only per call, through the subclasses something builds.

Round 25: a builder that runs per step and parks the object in an
attribute slot outside any ``if`` (``cache.curr_lens = lens`` in
``prefill_step``) replaces the last step's object: no keeping (a store
under a test, a lazy member, still keeps). A method that overrides a
project base's is reached where the base's is (``self.prefill_step(...)``
in the base's ``step`` runs the override). A value class, one whose own
methods (or a project base's) return a new object of the object's class
(``return self.__class__(...)`` in ``clone``, ``type(self)(...)``), is
made per operation like a tensor: a builder no per-step function reaches
is no obstacle when it drops or returns the object (a loader, a join),
tests (their module level too) are no evidence, and a class built only by
tests and its own copies is per call; a builder that keeps it, builds it
in a constructor or at module level, or is a run-once entry point
(``main``, ``cli``, ``setup_*``, ``build_*``, ``init_*``) still keeps T2.

Transitively (round 20): a class built only in the constructor of a class
built per call (``self.buffers = Buffers(...)`` in ``Metadata.__init__``,
and ``Metadata`` built every step) is per call too, and so are the buffers
of an initialiser method called only where its object is built
(``self.buffers.allocate()`` in that constructor).

Round 30 (docs/tiers.md §1, §3, §5): a builder that makes the object anew
in each pass of a loop, into a local the next pass rebinds (``blen =
BatchLenInfo(...)`` in a decode loop), or hands it straight to a call and
binds it nowhere (``model(ids, BatchLenInfo(...))``), keeps it one pass:
per call, also when the builder is a run-once ``main`` or no per-step
function reaches it (a benchmark's loop). Not when the object is added to
a container (``beams.append(Beam(...))``), returned, stored, handed to a
project class's constructor, built in a comprehension, or bound outside
every loop (``ws = Workspace(n)`` before the loop: kept for the run). A
class the pool pattern names (``BatchedKvCache``: T3 by its name) is per
call on the same evidence: the name says pool, the builders say one batch.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..catalog import CallerGlobs
from ..globs import matcher, test_path
from ..model import Assign, Language, Site, SiteKind, Tier
from .built_per_pass import class_factories
from .index import ClassInfo, Func, ProjectIndex
from .names import IDENTIFIER, has_name, has_word, starts_with_word
from .per_test_holders import builds_per_test
from .rebuilt_objects import rebuilt_per_pass
from .retier import Decision, retier

_CONSTRUCTOR = "constructor "  # the reason of the constructor pattern (rules/tiers.toml)
_INITIALISER = "initialiser "  # the reason of the initialiser pattern (`allocate_*`, `init_*`)
_REASONS = (_CONSTRUCTOR, _INITIALISER)
PINNED_PER_CALL = "pinned per call: "  # this pass's reason for a pinned site
# the reasons of the pinned constructor and initialiser patterns
_PINNED = ("persistent pinned host buffer created in ", "persistent pinned host buffer created by initialiser ")
_PLAIN = frozenset({"function", "method"})
# round 30: the pool class pattern's reason (a class named a KV cache or a pool, rules/tiers.toml); docs/tiers.md
# §3: a class every construction of which is per call keeps its buffers per call whatever its name says
_POOL_PATTERN = "pooled: "
_POOL_CONSTRUCTOR = " owns a fixed slab (constructor)"
_ENTRY = re.compile(r"([A-Za-z_]\w*)\[[^\]]*\]")  # `chunks[i]`
_CLASS_NAME = re.compile(r"[A-Z]\w*[a-z]\w*")  # `Instances`, not a constant's name
_SLOT = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")  # `cache.curr_lens`, no entry
_SELF_TYPE = frozenset({"self.__class__", "type(self)"})  # a copy of the object's own class
_ONCE = re.compile(r"_?main|_?run|cli|_?setup\w*|_?build\w*|_?init\w*|configure\w*")  # run-once entry points
_UP = 2  # calls up from a constructing function to a per-step function
_SET_UP = 3  # calls up through the object's own methods to where it is built


def built_per_call(sites: Sequence[Site], index: ProjectIndex, globs: CallerGlobs) -> list[Site]:
    if not globs.per_step:
        return list(sites)
    per_step = matcher(globs.per_step)
    memo: dict[str, str] = {}
    factories: dict[str, list[Func]] = {}

    unbuilt_memo: dict[str, bool] = {}

    def unbuilt(owner: ClassInfo) -> bool:
        if owner.key not in unbuilt_memo:
            unbuilt_memo[owner.key] = _unbuilt(owner, index, factories)
        return unbuilt_memo[owner.key]

    def per_call(owner: ClassInfo) -> str:
        """Where ``owner`` is built per call, "" when it is not."""
        key = owner.key
        if key not in memo:
            memo[key] = ""  # a class that builds itself (recursion) is not per call
            ctors = index.constructors(owner)
            memo[key] = "" if class_factories(index, ctors, factories) else \
                per_call_builders(ctors, index, per_step, per_call, unbuilt)
        return memo[key]

    def per_call_or_base(owner: ClassInfo) -> str:
        """``per_call``, or for a class nothing builds, how its base is built
        per call (asked once the base's answer is settled)."""
        found = per_call(owner)
        if found or owner.language is not Language.PYTHON or not owner.bases:
            return found
        found = _as_base(owner, index, per_call)  # the name scan of `unbuilt` only when it decides
        return found if found and unbuilt(owner) else ""

    def eligible(site: Site) -> bool:
        if site.language is not Language.PYTHON:
            return False
        if site.kind is SiteKind.PINNED_HOST:  # pinned in the constructor, re-made with each object
            return site.tier is Tier.T5B and site.tier_reason.startswith(_PINNED)
        return site.kind is SiteKind.DEVICE and (
            site.tier is Tier.T2 and site.tier_reason.startswith(_REASONS)
            or site.tier is Tier.T3 and site.tier_reason.startswith(_POOL_PATTERN) and site.tier_reason.endswith(
                _POOL_CONSTRUCTOR))

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        if func is None or func.scope is None or func.owner is None:
            return None
        if func.scope.role != "constructor" and not (
                func.scope.role == "method" and site.tier_reason.startswith((_INITIALISER, _PINNED[1]))
                and _set_up_at_build(func, func.owner, index, _SET_UP)):
            return None
        found = per_call_or_base(func.owner)
        if not found:
            return None
        if site.kind is SiteKind.PINNED_HOST:
            return Tier.T5A, (f"{PINNED_PER_CALL}{func.owner.name} is built only in per-call code ({found}), "
                              f"each object pins its own; was: {site.tier_reason}")
        return Tier.T4, (f"per call: {func.owner.name} is built only in per-call code ({found}); "
                         f"was: {site.tier_reason}")

    return retier(sites, eligible, decide)


def per_call_pinned(site: Site) -> bool:
    """A pinned site this pass made per call: a constructor's buffer of an
    object re-made per call, kept only by that object (``lifetimes`` leaves it)."""
    return site.tier_reason.startswith(PINNED_PER_CALL)


def direct_callers(funcs: list[Func], index: ProjectIndex) -> list[Func]:
    """The functions that call one of ``funcs`` directly (a class's builders, for its constructors), by id."""
    dist = index.callers_within(funcs, 1)
    return [index.funcs[fid] for fid, d in sorted(dist.items()) if d == 1 and fid in index.funcs]


def per_call_builders(ctors: list[Func], index: ProjectIndex, per_step: object,
                      per_call: Callable[[ClassInfo], str] | None = None,
                      unbuilt: Callable[[ClassInfo], bool] | None = None) -> str:
    """The functions that build the class, each per step or reached from a
    per-step function, or the constructor of a class built per call (a
    subclass ``unbuilt`` says nothing builds is no evidence), named with
    the per-step function; "" when any is not."""
    if not ctors:
        return ""
    builders = direct_callers(ctors, index)
    if not builders:
        return ""
    named = []
    pending: list[ClassInfo] = []
    tests: list[Func] = []
    owner = ctors[0].owner
    value = _value_copy(owner, index) if owner is not None and per_call is not None else ""
    for builder in builders:
        if value and test_path(builder.path):
            continue  # a test's module level builds a value as its functions do: no evidence
        if owner is None or builder.scope is None:
            return ""
        if per_call is not None and builder.scope.role == "constructor" and builder.owner is not None \
                and builder.owner is not owner:
            # `self.buffers = Buffers(...)` in the constructor of a class built per call
            if not per_call(builder.owner):
                if unbuilt is None:
                    return ""
                pending.append(builder.owner)  # no evidence if nothing builds it (told last: a name scan)
                continue
            named.append(f"{builder.qualname} of a per-call {builder.owner.name}")
            continue
        if _own_copy(builder, owner, index):
            continue  # `return Keypoints(self.tensor[item])` in `Keypoints.__getitem__`: no evidence
        if test_path(builder.path):
            tests.append(builder)  # no evidence beside other builders; alone, a test's object lives one case
            continue
        stepper = _stepper(builder, index, per_step)
        if builder.scope.role not in _PLAIN or keeps(builder, owner, index, per_call, stepper is not None) \
                or _result_kept(builder, index):
            return ""
        if stepper is None and (how := rebuilt_per_pass(builder, owner, index)):
            named.append(f"{builder.qualname} ({how})")
            continue
        if stepper is None and not _only_tests_call(builder, index):
            if not value or _ONCE.fullmatch(builder.name):
                return ""
            named.append(f"{builder.qualname} (drops or returns it)")
            continue
        if stepper is not None:
            named.append(builder.qualname if stepper is builder else f"{builder.qualname} <- {stepper.qualname}")
    if value and not named and not pending:
        named.append("tests only")
    elif (per_call is not None and not named and not pending and tests and owner is not None
          and all(test_path(p) for p in owner.paths) and all(builds_per_test(t, index) for t in tests)):
        more = f", +{len(tests) - 1} more" if len(tests) > 1 else ""
        named.append(f"only tests build it ({tests[0].qualname}{more}), an object per test case")
    if not named or (unbuilt is not None and not all(unbuilt(sub) for sub in pending)):
        return ""
    if value:
        named[0] = f"a value class ({value} returns a new {owner.name if owner else 'object'}): {named[0]}"
    shown = ", ".join(named[:3]) + (f", +{len(named) - 3} more" if len(named) > 3 else "")
    return shown


def _value_copy(owner: ClassInfo, index: ProjectIndex) -> str:
    """Round 25: the method of ``owner`` (or of a project base) that returns
    a new object of the object's own class (``return self.__class__(...)``,
    ``type(self)(...)``, ``return Meshes(...)`` in ``Meshes.clone``): a
    value class, whose operations make new objects, like a tensor's; ""
    when none does."""
    if owner.language is not Language.PYTHON:
        return ""
    for cls in [owner, *index.base_classes(owner)]:
        for funcs in cls.methods.values():
            for func in funcs:
                if func.scope is None or func.scope.role != "method" or func.scope.params[:1] != ("self",):
                    continue  # a classmethod factory (`cls.static(dim)`) makes no copy of an object
                if any(c.callee in _SELF_TYPE for c in func.calls) or _own_copy(func, owner, index):
                    return f"{cls.name}.{func.name}"
    return ""


def _unbuilt(owner: ClassInfo, index: ProjectIndex, factories: dict[str, list[Func]]) -> bool:
    """Nothing in the project builds ``owner``: no call of its constructors
    (a subclass's ``super().__init__`` included), no ``cls(...)`` factory,
    and its name is read nowhere outside its own methods (held in a table,
    ``NORM_MAPPING["x"] = C``, handed on, called through an alias)."""
    ctors = index.constructors(owner)
    if not ctors or class_factories(index, ctors, factories) or any(
            d == 1 for d in index.callers_within(ctors, 1).values()):
        return False
    name = owner.name
    for func in index.functions():
        if func.owner is owner or func.language is not Language.PYTHON:
            continue
        table = func.table
        if table is not None and any(has_word(table.callees[i], name) or has_word(table.arglists[i], name)
                                     for i in func.call_ix):
            return False
        if any(has_word(a.value, name) for a in func.assigns) or any(has_word(r.value, name) for r in func.returns):
            return False
    return True


def _as_base(owner: ClassInfo, index: ProjectIndex, per_call: Callable[[ClassInfo], str]) -> str:
    """A class nothing builds lives as its siblings do: where its project
    base (one class of that name) is built only per call, through its other
    subclasses (``AttentionReplace`` beside the ``AttentionRefine`` made per
    ``generate``); "" otherwise."""
    for base in owner.bases:
        found = index.classes_named(base.split("[", 1)[0].rsplit(".", 1)[-1])
        if len(found) == 1 and found[0] is not owner and (how := per_call(found[0])):
            return f"never built itself; its base {found[0].name} is built only per call: {how}"
    return ""


def _set_up_at_build(func: Func, owner: ClassInfo, index: ProjectIndex, depth: int) -> bool:
    """Every caller of the method ``func`` of ``owner`` is ``owner``'s
    constructor, a function that builds ``owner`` (``self.buffers =
    Buffers(...); self.buffers.allocate()``), or (``depth`` calls up) another
    method of ``owner`` called only there: it runs once per object."""
    builders = {fid for fid, d in index.callers_within(index.constructors(owner), 1).items() if d == 1}
    callers = [fid for fid, d in index.callers_within([func], 1).items() if d == 1]
    callers += [fid for fid in sorted(builders) if fid not in callers and _calls_on_built(index.funcs.get(fid), owner,
                                                                                       func.name, index)]
    if not callers:
        return False
    for fid in callers:
        caller = index.funcs.get(fid)
        if caller is None or caller.scope is None:
            return False
        if fid in builders or (caller.owner is owner and caller.scope.role == "constructor"):
            continue
        if caller.owner is owner and caller is not func and depth > 1 and caller.scope.role == "method" \
                and _set_up_at_build(caller, owner, index, depth - 1):
            continue
        return False
    return True


def _calls_on_built(builder: Func | None, owner: ClassInfo, method: str, index: ProjectIndex) -> bool:
    """``builder`` calls ``method`` on the object of ``owner`` it builds
    (``self.buffers = Buffers(...)`` then ``self.buffers.allocate()``), a
    call the call graph may not resolve."""
    if builder is None:
        return False
    targets = {(c.target or "").strip() for c in builder.calls if index.constructed_class(builder, c) is owner}
    return any(c.callee == f"{t}.{method}" for c in builder.calls for t in targets if t)


def _result_kept(builder: Func, index: ProjectIndex) -> bool:
    """A caller stores what ``builder`` returns in a container entry
    (``module.samplers[name] = make_sampler(...)``, made once per key): the
    object outlives the call. (``self.controller = make_controller(...)`` in
    a per-call method replaces it on every call: still per call.)"""
    for fid, distance in index.callers_within([builder], 1).items():
        caller = index.funcs.get(fid)
        if distance != 1 or caller is None:
            continue
        for call in caller.calls:
            target = (call.target or "").strip()
            if target.endswith("]") and call.callee.rsplit(".", 1)[-1] == builder.name \
                    and builder in index.resolve(caller, call):
                return True
    return False


def keeps(func: Func, owner: ClassInfo, index: ProjectIndex,
          per_call: Callable[[ClassInfo], str] | None = None, per_step: bool = False) -> bool:
    """``func`` keeps an object of ``owner`` it builds: stored on an object
    or in a container (``self.state = State(...)``, ``runners[d] = runner``,
    ``self._fb = fb.to(device)``, ``self._fb = Fb(...).to(device)``), or
    handed to another project class's constructor (``Replace(..., lb)``),
    unless ``per_call`` says that class is itself built per call (the
    object then lives as the per-call object holding it does).

    Round 25: when ``func`` runs per step (``per_step``), a store of the
    object's name into an attribute slot on no test (``cache.curr_lens =
    lens`` in ``prefill_step``) replaces the previous step's object: the
    slot holds one step's object, no keeping. A store under an ``if`` (a
    lazy member, ``if self.x is None: self.x = x``) still keeps."""
    calls = func.calls
    stores = [a for a in func.assigns if any(not t.strip().isidentifier() for t in a.targets)
              and not (per_step and _replaced_slot(func, a))]
    for call in calls:
        if index.constructed_class(func, call) is not owner:
            continue
        target = (call.target or "").strip()
        if target and not target.isidentifier() and not _own_entry(func, target) and not _own_holder(func, target):
            return True  # `self.state = State(...)`, `cls.wrappers[d] = Wrapper(...)`
        if not target:
            if any(a.line == call.span.line for a in stores) or any(
                    c.span.line == call.span.line and c.target and not _plain_locals(c.target) for c in calls):
                return True  # `self._fb = Fb(...).to(device)`
            continue
        if any(a.line > call.span.line and starts_with_word(a.value.strip(), target) for a in stores) or any(
                c.span.line > call.span.line and c.target and not c.target.strip().isidentifier()
                and starts_with_word(c.callee, target) for c in calls):
            return True  # `runners[d] = runner`, `self._fb = fb.to(device)`
        if any(c.span.line > call.span.line and has_word(c.arglist, target) and (held := index.constructed_class(
                func, c)) is not None and (held is owner or per_call is None or not per_call(held)) for c in calls):
            return True
    return False


def _plain_locals(target: str) -> bool:
    """``x`` or ``logits, _``: a call's result unpacked into plain locals, no store."""
    return all(t.strip().isidentifier() for t in target.strip().strip("()").split(","))


def _replaced_slot(func: Func, store: Assign) -> bool:
    """``store`` binds a plain name to attribute slots (``a.b = x``, no entry,
    no augmented assignment) outside every ``if`` of ``func``: each call
    overwrites what the last one stored."""
    if store.op != "=" or not IDENTIFIER.fullmatch(store.value.strip()) or not all(
            _SLOT.fullmatch(t.strip()) for t in store.targets):
        return False
    return not any(b.kind == "if" and b.span.contains_line(store.line) for b in func.blocks)


def _own_entry(func: Func, target: str) -> bool:
    """``target`` is an entry of a list or dict ``func`` makes itself
    (``chunks = [None for _ in range(n)]`` ... ``chunks[0] = C(...)``) and
    never hands on whole: not returned, stored, aliased nor passed to a
    call (its entries may be read): the object dies with the call."""
    found = _ENTRY.fullmatch(target)
    if found is None:
        return False
    root = found.group(1)
    params = func.scope.params if func.scope is not None else ()
    if root in params or root in ("self", "cls"):
        return False
    binds = [a for a in func.assigns if root in (t.strip() for t in a.targets)]
    if len(binds) != 1 or binds[0].value.strip()[:1] not in ("[", "{") or any(
            c.target is not None and c.target.strip() == root for c in func.calls):
        return False
    if any(has_name(r.value, root, not_after="[.") for r in func.returns):
        return False
    if any(a is not binds[0] and has_name(a.value, root, not_after="[.") for a in func.assigns):
        return False
    return not any(has_name(c.arglist, root, not_after="[.") for c in func.calls)


def _own_holder(func: Func, target: str) -> bool:
    """``target`` is an attribute of an object ``func`` builds itself
    (``target = Instances(size)`` ... ``target.gt_keypoints = Keypoints(k)``)
    and never stores on another object nor in a container (it may return it,
    as it may return the object itself): the object lives as that holder
    does, one call unless a caller keeps it."""
    root, dot, _ = target.partition(".")
    params = func.scope.params if func.scope is not None else ()
    if not dot or not root.isidentifier() or root in params or root in ("self", "cls"):
        return False
    if any(root in (t.strip() for t in a.targets) for a in func.assigns):
        return False  # bound to a value other than a construction, or deleted
    binds = [c for c in func.calls if c.target is not None and c.target.strip() == root]
    if len(binds) != 1 or not _CLASS_NAME.fullmatch(binds[0].callee.rsplit(".", 1)[-1]):
        return False
    stored = (a for a in func.assigns if any(not t.strip().isidentifier() for t in a.targets))
    handed = (c for c in func.calls if c.target is not None and not c.target.strip().isidentifier())
    return not any(has_name(a.value, root, not_after="[.") for a in stored) and not any(
        has_name(c.arglist, root, not_after="[.") for c in handed)


def _own_copy(func: Func, owner: ClassInfo, index: ProjectIndex) -> bool:
    """``func`` is a plain method of ``owner`` (or of a subclass) that
    returns the new object of ``owner`` it builds from its own
    (``return Keypoints(self.tensor[item])`` in ``__getitem__``, ``clone``,
    ``to``): a copy lives as its caller keeps it, no evidence either way."""
    if func.scope is None or func.scope.role != "method" or func.owner is None:
        return False
    if func.owner is not owner and owner.name not in func.owner.bases:
        return False
    built = [c for c in func.calls if index.constructed_class(func, c) is owner]
    return bool(built) and not keeps(func, owner, index) and all(
        any(r.line == c.span.line for r in func.returns) for c in built)


def _only_tests_call(func: Func, index: ProjectIndex) -> bool:
    """Every function that calls ``func`` is test code, and one does (an
    operation the tests call once per test)."""
    dist = index.callers_within([func], 1)
    callers = [fid for fid, d in dist.items() if d == 1]
    return bool(callers) and all(test_path(fid.split("::", 1)[0]) for fid in callers)


def _stepper(func: Func, index: ProjectIndex, per_step: object) -> Func | None:
    """``func`` when it is per step, or a per-step function that reaches it within ``_UP`` calls."""
    assert callable(per_step)
    if per_step(func.name):
        return func
    dist = index.callers_within(_overridden(func, index), _UP)
    ups = [f for fid in sorted(dist, key=lambda f: (dist[f], f)) if dist[fid] > 0 and (f := index.funcs.get(fid))]
    return next((f for f in ups if per_step(f.name)), None)


def _overridden(func: Func, index: ProjectIndex) -> list[Func]:
    """``func`` and the methods of that name of its class's project bases
    (round 25): ``self.prefill_step(tasks)`` in a base's ``step`` runs the
    subclass's override, a call the call graph resolves to the base's."""
    owner = func.owner
    if owner is None or func.scope is None or func.scope.role != "method" or owner.language is not Language.PYTHON:
        return [func]
    found = [func]
    for base in index.base_classes(owner):
        found += [m for m in base.methods.get(func.name, []) if m not in found]
    return found
