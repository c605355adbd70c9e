"""The Python extractor's byte gates and memos (issue 15, round 5b): each
answers exactly what the search or proof it skips would have answered.

- ``host_loaded_file`` searches only files with a quoted ``cpu``;
- ``fake_aliases`` searches only files that spell a fake-impl decorator;
- ``default_source`` proves each (function, name) once per file: the
  ``torch.`` gate before the call is still asked per call;
- ``_listy`` is cached by the parameter text, and parses only a text that
  spells a list word, a string or an escape (perf-r28);
- ``fake_keywords`` tries the keyword pattern only after the last `(`/`,`
  before each `fake`, and finds what the pattern finds in the whole file
  (perf-r28);
- ``host_locals`` looks for the locals bound to the host first, then at
  their other bindings only in a file that has some."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alloc_audit.catalog import load_catalog
from alloc_audit.config import load_config
from alloc_audit.model import Assign, FileFacts, Language
from alloc_audit.pipeline.extract import extract_facts
from alloc_audit.pipeline.extract import python_host_defaults as defaults
from alloc_audit.pipeline.extract import python_host_tests as host_tests
from alloc_audit.pipeline.extract.python_sites import classify_device
from alloc_audit.pipeline.extract.python_statements import host_locals
from alloc_audit.pipeline.parse import parse_source


def extract(source: str, tmp_path: Path, name: str = "m.py") -> FileFacts:
    apis = load_catalog(load_config(tmp_path, None)).apis
    return extract_facts(name, Language.PYTHON, parse_source(source.encode(), Language.PYTHON), apis)


@pytest.mark.parametrize("source", [
    b'sd = torch.load(f, map_location="cpu")\n',  # loads on the host, names no other device
    b"sd = load_file(p, device='cpu')\n",
    b"with safe_open(p, framework='pt', device='cpu') as f:\n    pass\n",
    b'sd = torch.load(f, map_location="cpu")\nx = y.cuda()\n',  # another device named
    b'd = "cpu"\nsd = torch.load(f, map_location=d)\n',  # quoted cpu, but not in a loader call
    b"sd = torch.load(f, map_location=cpu)\n",  # no quote: the gate alone rules it out
    b"x = torch.zeros(3)\n",
    b"",
])
def test_host_loaded_gate_answers_as_the_search(source: bytes) -> None:
    searched = host_tests._CPU_LOAD.search(source) is not None and host_tests._OTHER_DEVICE_WORDS.search(source) is None
    assert host_tests.host_loaded_file(source) is searched


def test_host_loaded_gate_keeps_a_converter(tmp_path: Path) -> None:
    source = ("import torch\n\ndef convert(p):\n    sd = torch.load(p, map_location='cpu')\n"
              "    return torch.zeros_like(sd['w'])\n")
    assert host_tests.host_loaded_file(source.encode())
    assert [s.api for s in extract(source, tmp_path).sites] == []  # a copy of a host tensor: no device site


FAKE = """import torch

_fake = torch.library.register_fake

@_fake("ns::op")
def op_fake(x):
    return torch.empty_like(x)

def op_real(x):
    return torch.empty_like(x)
"""


def test_fake_alias_gate(tmp_path: Path) -> None:
    # the alias is found (its file spells `register_fake`): only the real op's allocation is a site
    assert [s.scope for s in extract(FAKE, tmp_path).sites] == ["op_real"]
    # `Meta` opens the file to fake scopes, but no decorator is spelled: no alias, both stay sites
    meta = FAKE.replace("_fake = torch.library.register_fake", "Meta = None")
    assert [s.scope for s in extract(meta, tmp_path).sites] == ["op_fake", "op_real"]


DEFAULTS = """import torch

def f(n):
    a = torch.empty_like(x)
    x = torch.arange(n)
    b = torch.empty_like(x)
    c = torch.zeros_like(x)
    return a, b, c

def g(x):
    y = torch.ones(3)
    return torch.empty_like(x)

def h(n):
    x = torch.arange(n)
    return torch.empty_like(x)
"""


def test_default_source_memo_per_function_and_name(tmp_path: Path) -> None:
    facts = extract(DEFAULTS, tmp_path)
    # f: the first `empty_like(x)` has no `torch.` above it in the function (the per-call gate): a site of an
    # unknown device; the later two are on the default device, the second answered from the memo
    copies = [(s.scope, s.span.line) for s in facts.default_sites if s.api.endswith("_like")]
    assert copies == [("f", 6), ("f", 7), ("h", 16)]
    # g's `x` is a parameter: not proven, though f and h proved a local `x` (the memo is per function)
    assert [(s.scope, s.span.line) for s in facts.sites] == [("f", 4), ("g", 12)]


def test_listy_cached_by_parameter_text() -> None:
    defaults._listy.cache_clear()
    first = defaults._listy("(self, betas: list[float], t: torch.Tensor)")
    assert first == frozenset({"betas"})
    assert defaults._listy("(self, betas: list[float], t: torch.Tensor)") is first
    assert defaults._listy.cache_info().hits == 1
    assert defaults._listy("(self, betas: torch.Tensor)") == frozenset()  # another text: asked afresh


def host_locals_by_every_binding(assigns: list[Assign], call_targets: set[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """``host_locals`` as it was written before round 5b: every binding's device, per local."""
    values: dict[tuple[str, str], set[str]] = {}
    for a in assigns:
        host = len(a.targets) == 1 and a.op == "=" and any(w in a.value.lower() for w in ("cpu", "meta"))
        device = classify_device(a.value) if host else "unknown"
        for target in a.targets:
            values.setdefault((a.scope, target), set()).add(device)
    return frozenset(k for k, v in values.items() if k not in call_targets and v and v <= {"cpu", "meta"})


_NAMES = st.sampled_from(["dev", "d", "x"])
_ASSIGNS = st.builds(Assign, scope=st.sampled_from(["f", "g"]), line=st.just(1),
                     targets=st.lists(_NAMES, min_size=0, max_size=2).map(tuple),
                     value=st.sampled_from(['"cpu"', "'META'", '"cuda"', 'torch.device("cpu")', "pick()", "cpu_dev",
                                            "0"]),
                     op=st.sampled_from(["=", "+="]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # not timed: the machine is shared
@given(st.lists(_ASSIGNS, max_size=8), st.sets(st.tuples(st.sampled_from(["f", "g"]), _NAMES), max_size=2))
def test_host_locals_answers_as_every_binding(assigns: list[Assign], call_targets: set[tuple[str, str]]) -> None:
    assert host_locals(assigns, call_targets) == host_locals_by_every_binding(assigns, call_targets)


def test_host_locals_examples() -> None:
    cpu, cuda = Assign("f", 1, ("dev",), '"cpu"'), Assign("f", 2, ("dev",), '"cuda"')
    assert host_locals([cpu], set()) == {("f", "dev")}
    assert host_locals([cpu, cuda], set()) == frozenset()  # bound another way too
    assert host_locals([cpu, Assign("g", 2, ("dev",), '"cuda"')], set()) == {("f", "dev")}  # another function's
    assert host_locals([cpu], {("f", "dev")}) == frozenset()  # also bound from a call


@pytest.mark.parametrize("params", [
    "(self, betas: list[float], t: torch.Tensor)", "(x: int, y: Optional[torch.Tensor] = None)",
    "(a: 'List[int]', b)", "(a: \"li\" \"st\")", "(a: Sequence[int], *, b: Tuple[int, ...])",
    "(xs: np.ndarray, n: int = 3)", "(a: Dict[str, int], b: Callable[[int], int])", "(a: Any)", "(a: 'x', b: list)",
    "(self, x: Tensor,  # a list of them\n y: int)", "(a: MyList, b: tuple_like)", "(a: Union[list, Tensor])",
])
def test_listy_gate_answers_as_the_parse(params: str) -> None:
    defaults._listy.cache_clear()
    gated = defaults._listy(params)
    # the parse itself, without the gate (what the gate skips must find nothing)
    fn = ast.parse(f"def f{params}: pass").body[0]
    assert isinstance(fn, ast.FunctionDef)
    notes = {a.arg: ast.unparse(a.annotation) for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)
             if a.annotation is not None}
    expected = {n for n, note in notes.items() if defaults._LISTY.search(note) and not defaults._TENSORY.search(note)}
    assert gated == frozenset(expected)


@pytest.mark.parametrize("data", [
    b"f(fake=x)", b"f(a, gen_fake=y,fake_impl = z )", b"(,fake=a,fake=b)", b"((fake=a)", b"fake=x)",
    b"register(op, fake_fn=None, fake_mode=m)", b"g(\n    fake_impl=f_fake,\n)\n", b"h(x_fake_func=q)",
    b"f(fake = \n a\n)", b"",
])
def test_fake_keywords_are_those_of_the_pattern(data: bytes) -> None:
    from alloc_audit.pipeline.extract.python_fake import _FAKE_KEYWORD, fake_keywords
    assert fake_keywords(data) == [m.group(1) for m in _FAKE_KEYWORD.finditer(data)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"fake", b"_", b"gen", b"impl", b"fn", b"=", b" ", b"\n", b"\t", b",", b"(", b")",
                                 b"x", b"None", b"func", b"tion", b"1"]), max_size=40).map(b"".join))
def test_fake_keywords_match_the_pattern_on_generated_text(data: bytes) -> None:
    from alloc_audit.pipeline.extract.python_fake import _FAKE_KEYWORD, fake_keywords
    assert fake_keywords(data) == [m.group(1) for m in _FAKE_KEYWORD.finditer(data)]


def test_fake_keywords_match_the_pattern_on_the_package_sources() -> None:
    from alloc_audit.pipeline.extract.python_fake import _FAKE_KEYWORD, fake_keywords
    root = Path(__file__).resolve().parent.parent
    for path in sorted((root / "alloc_audit").rglob("*.py")) + sorted((root / "tests").rglob("*.py")):
        data = path.read_bytes()
        assert fake_keywords(data) == [m.group(1) for m in _FAKE_KEYWORD.finditer(data)], path
