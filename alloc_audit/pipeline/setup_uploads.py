"""Stage 5, after run_once (C++): weights a run-once native program uploads
and installs on its model are T1 (docs/tiers.md §2, "weights are T1 whoever
loads them"; round 30).

Input: classified sites and the project index. Output: the same sites, the
C++ device buffers ``run_once`` made T2 (a function run once per process
allocating outside its loops) re-tiered T1 when both hold:

- the function fills the buffer from host data: a copy into it
  (``cudaMemcpy(w, h_w, n, cudaMemcpyHostToDevice)``), or a project function
  it hands the buffer to (``load_weights(&w, "w.in", n)``) that copies into
  the parameter it arrives in (``cudaMemcpy(*ptr, h, n, ...)``);
- the function installs it in an object a model keeps: it stores it in a
  member of a local (``param.attr_kernel = w;``), and hands that local,
  outside its loops, to a project method or constructor that stores the
  parameter it arrives in (``layer->initialize(param)`` with
  ``param_ = param;``).

    T* w; device_malloc(&w, n); load_weights(&w, "qkv.in", n);
    param.qkv = w; layer->initialize(param);     // T1: the model's weights

False cases (stay T2): an input uploaded the same way but handed to a call
each pass (``infer_param{x, ...}; for (...) layer->infer(infer_param)``:
``infer`` keeps nothing), a buffer stored in a local handed only to calls
that keep nothing, a workspace installed without a copy, a copy back to the
host (``cudaMemcpyDeviceToHost``). One function, its callees' own text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..arglists import split_args
from ..model import Language, Site, SiteKind, Tier
from .index import Func, ProjectIndex
from .names import IDENTIFIER
from .retier import Decision, retier

_COPY = re.compile(r"(?:cuda|hip)\w*[Cc]py\w*")
_LEAF = re.compile(r"::|\.|->")
_MEMBER_OF = re.compile(r"\s*([A-Za-z_]\w*)\s*(?:\.|->)")  # `param.w`, `p->w`: a member of the local `param`
_RECEIVER = re.compile(r"([A-Za-z_]\w*)\s*(?:\.|->)\s*\w+$")  # `layer->infer`: the object a method runs on
# reading a file: the host data a program uploads as its weights (`fopen`/`fscanf`, `std::ifstream`)
_READS = re.compile(r"fopen|fread|fscanf|fgets|ifstream|mmap|open")


def setup_uploads(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    """Run-once native buffers filled from the host and installed on a model: T1."""

    def eligible(site: Site) -> bool:
        return (site.tier is Tier.T2 and site.kind is SiteKind.DEVICE and site.language is not Language.PYTHON
                and site.tier_reason.startswith("run once per process") and bool(site.target))

    def decide(site: Site) -> Decision | None:
        func = index.func(site.path, site.scope)
        name = (site.target or "").strip()
        if func is None or not name.isidentifier():
            return None
        filled = _filled(func, name, index)
        installed = _installed(func, name) if filled else ""
        if not installed:
            return None
        return Tier.T1, (f"weight upload: {func.qualname} fills {name} from the host ({filled}) and installs it "
                         f"on the model ({installed}) (was: {site.tier_reason})")

    return retier(sites, eligible, decide)


def _to_device(call_callee: str, arglist: str) -> bool:
    return _COPY.fullmatch(_LEAF.split(call_callee)[-1]) is not None and "ToHost" not in arglist \
        and "DeviceToDevice" not in arglist


def _names(text: str) -> list[str]:
    return IDENTIFIER.findall(text)


def _filled(func: Func, name: str, index: ProjectIndex) -> str:
    """How ``func`` copies data it reads from a file into ``name``: a copy
    call whose destination is it in a function that reads a file, or a
    project function handed it that reads a file and copies into that
    parameter (``load_weights(&w, "w.in", n)``); "" if neither."""
    for call in func.calls:
        args = split_args(call.arglist, cpp=True)
        if not args:
            continue
        if _to_device(call.callee, call.arglist):
            if _names(args[0].text)[-1:] == [name] and _reads_file(func):
                return f"{call.callee} at line {call.span.line} of what it reads"
            continue
        at = [i for i, a in enumerate(args) if _names(a.text.replace("void", "")) == [name]]
        if not at:
            continue
        for callee in index.resolve(func, call):
            params = callee.scope.params if callee.scope is not None else ()
            names = {_names(params[i])[-1] for i in at if i < len(params) and _names(params[i])}
            if names and _reads_file(callee) and any(_copies_into(c.callee, c.arglist, names) for c in callee.calls):
                return f"{call.callee} at line {call.span.line}, which reads a file and copies it in"
    return ""


def _copies_into(callee: str, arglist: str, names: set[str]) -> bool:
    if not _to_device(callee, arglist):
        return False
    args = split_args(arglist, cpp=True)
    dest = _names(args[0].text) if args else []
    return bool(dest) and dest[-1] in names


def _reads_file(func: Func) -> bool:
    return any(_READS.fullmatch(_LEAF.split(c.callee)[-1]) for c in func.calls)


def _installed(func: Func, name: str) -> str:
    """How ``func`` hands ``name`` to an object it runs in its loops: stored
    in a member of a local (``param.w = name``) handed, outside ``func``'s
    loops, to a method of an object (``layer->initialize(param)``) or to
    the construction of one (``new Layer(param)``) that a loop of ``func``
    then calls (``layer->infer(x)``), the local itself handed to no call in
    a loop (an input is handed each pass); ""."""
    locals_ = {t for a in func.assigns if a.type for t in a.targets}
    holders = set()
    for a in func.assigns:
        if a.op == "=" and a.value.strip() == name and len(a.targets) == 1:
            root = _MEMBER_OF.match(a.targets[0])
            if root is not None and root.group(1) in locals_:
                holders.add(root.group(1))
    calls = func.calls
    looped = {m.group(1) for c in calls if func.in_loop(c.span.line) for m in [_RECEIVER.match(c.callee)] if m}
    for holder in sorted(holders):
        word = re.compile(rf"&?\s*{re.escape(holder)}")
        handed = [c for c in calls if any(word.fullmatch(a.text.strip()) for a in split_args(c.arglist, cpp=True))]
        if not handed or any(func.in_loop(c.span.line) for c in handed):
            continue
        for call in handed:
            receiver = _RECEIVER.match(call.callee)
            model = receiver.group(1) if receiver is not None else (call.target or "").strip()
            if model and model != holder and model in looped:
                return f"{holder}, handed to {call.callee} at line {call.span.line}; a loop runs {model}"
    return ""
