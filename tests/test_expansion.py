"""What the on-demand expansion parses: files the pre-filter skipped are
parsed only when the rules or the derived sites could need them, judged from
the names they mention and, for the few that mention one, a look at their
bytes. The end-to-end behaviour is pinned by the ``project-cross-file``
fixture (``pkg/service.py`` mentions no allocation API and is parsed on
demand for the derived sites it holds)."""

from __future__ import annotations

import random

from alloc_audit.pipeline.expand import (
    SkippedFile,
    WantedFiles,
    identifiers,
    mentions,
    native_definitions,
    python_keeps_call,
)

ENGINE = (frozenset({"engine", "buffers"}), frozenset({"engine"}))  # module parts, packages


def said(*names: str) -> str:
    """What a skipped file that mentions ``names`` is remembered by (``identifiers``' text)."""
    return " " + " ".join(names) + " "


def never_read() -> SkippedFile:
    raise AssertionError("a file's bytes are read again only when it mentions a wanted name")


def reads(text: str):
    return lambda: SkippedFile(lambda: text.encode())


def test_a_native_file_never_calls_a_python_factory():
    wants = WantedFiles(definitions=frozenset(), classes={"Arena": ENGINE}, functions={"make_workspace": ENGINE})
    assert not wants.wants_file("csrc/kernel.cuh", said("Arena", "make_workspace", "engine", "buffers"), never_read)


def test_a_python_file_reaches_a_factory_through_its_module_or_package():
    wants = WantedFiles(definitions=frozenset(), classes={"Arena": ENGINE})
    # `from engine.buffers import Arena`, or a re-export from `engine`
    assert wants.wants_file("app/serve.py", said("buffers", "Arena"), never_read)
    assert wants.wants_file("app/serve.py", said("engine", "Arena"), never_read)
    # `from . import Arena` inside the same package
    assert wants.wants_file("engine/serve.py", said("Arena"), never_read)
    # a local class or a pytest fixture of the same name elsewhere
    assert not wants.wants_file("tests/test_serve.py", said("Arena", "torch"), never_read)


def test_a_factory_function_counts_where_its_result_is_kept():
    wants = WantedFiles(definitions=frozenset(), functions={"make_workspace": ENGINE})
    local = "from engine import make_workspace\n\ndef test_it():\n    ws = make_workspace(4)\n    check(ws)\n"
    kept = "from engine import make_workspace\n\nclass Runner:\n    def __init__(self):\n" \
           "        self.ws = make_workspace(4)\n"
    assert not wants.wants_file("tests/test_ws.py", identifiers(local.encode()), reads(local))
    assert wants.wants_file("app/runner.py", identifiers(kept.encode()), reads(kept))


def test_python_keeps_call():
    names = ("make",)
    kept = [
        "buf = make(4)\n",  # module level
        "class A:\n    buf = make(4)\n",  # class body
        "class A:\n    def f(self):\n        self.buf = make(4)\n",
        "def build():\n    return make(4)\n",  # a factory of its own
        "def f(self):\n    self.a, self.b = make(4)\n",
        "def f():\n    out = (\n        make(4)\n    )\n",  # a continuation line: cannot tell, parse
        "def f():\n    if x:\n        pass\n    cache[k] = make(4)\n",
        "def f():\n    out = make(4)\n    out.zero_()\n    return out\n",  # handed back through a local
    ]
    dropped = [
        "def f():\n    out = make(4)\n\ndef g(out):\n    return out\n",
        "def f():\n    x: Tensor = make(4)\n",
        "def f():\n    check(make(4))\n",
        "def f():\n    for _ in range(3):\n        assert make(4) is not None\n",
        "from engine import make\n",
        "def f():\n    return cute.make(4)\n",  # another module's function of the same name
    ]
    assert python_keeps_call(b"import engine.buffers as eb\n\ndef f():\n    return eb.make(4)\n", names,
                             ("engine", "buffers"))
    assert python_keeps_call(b"def f():\n    return buffers.make(4)\n", names, ("engine", "buffers"))
    assert python_keeps_call(b"from engine import buffers as eb\n\ndef f():\n    return eb.make(4)\n", names,
                             ("engine", "buffers"))
    assert not python_keeps_call(b"import cutlass.cute as cute\n\ndef f():\n    return cute.make(4)\n", names,
                                 ("engine", "buffers"))
    for text in kept:
        assert python_keeps_call(text.encode(), names), text
    for text in dropped:
        assert not python_keeps_call(text.encode(), names), text


def test_a_function_too_long_to_look_through_is_parsed():
    body = "".join(f"    v{i} = {i}\n" for i in range(3000))
    text = "def f():\n    out = make(4)\n" + body + "    return out\n"
    assert python_keeps_call(text.encode(), ("make",))  # no look so far down: it errs on parsing
    short = "def f():\n    out = make(4)\n" + body[:2000] + "\ndef g(out):\n    return out\n"
    assert not python_keeps_call(short.encode(), ("make",))


def test_native_mentions_and_definitions():
    wants = WantedFiles(definitions=frozenset({"launch_plan"}), native_mentions=frozenset({"DeviceArena"}))
    assert wants.wants_file("csrc/arena_user.cc", said("DeviceArena", "int"), never_read)
    assert not wants.wants_file("csrc/other.cc", said("int", "size_t"), never_read)
    assert wants.wants_file("csrc/plan.cc", said("launch_plan", "int"), reads("void launch_plan(int n) {\n}\n"))
    # a file that calls launch_plan but does not define it is not wanted
    assert not wants.wants_file("csrc/caller.cc", said("launch_plan", "main"),
                                reads("int main() {\n  launch_plan(4);\n}\n"))
    assert native_definitions(b"struct DeviceArena {\n};\nclass Pool : public Base {\n};\n") == \
        {"DeviceArena", "Pool"}


def test_alias_lines_find_what_the_whole_file_finds():
    # perf-r28: `python_keeps_call` reads import aliases from the lines that spell `import` only
    from pathlib import Path

    from alloc_audit.pipeline.expand import _ALIAS, _lines_with
    root = Path(__file__).resolve().parent.parent
    samples = [b"", b"import a.b as c", b"x = 1\nfrom p.q import r as s\n  import t as u\r\nimportx as y\n",
               b"\n\nimport a as b\nimport c as d", b"# import x as y\nfrom . import z as w\n", b"import\nas x\n"]
    for path in sorted((root / "alloc_audit").rglob("*.py")) + sorted((root / "tests").rglob("*.py")):
        samples.append(path.read_bytes())
    for data in samples:
        assert _ALIAS.findall(_lines_with(data, b"import")) == _ALIAS.findall(data)


def test_identifiers_text_lists_each_name_once_in_order_of_first_mention():
    assert identifiers(b"x = torch.empty(n)\ntorch.cuda.empty_cache()  # ok 9abc _a1 ab\n") == \
        " torch empty cuda empty_cache abc _a1 "  # `9abc`: the run less its leading digit
    assert identifiers(b"") == "  " and identifiers(b"a = b + 1").split() == []


def test_mentions_is_membership_of_a_whole_identifier():
    """``mentions`` answers as ``name in names.split()``: never for part of an
    identifier, two of them with the space between, or an empty name (the
    round 34 form bisected a sorted tuple of the names for equality)."""
    rng = random.Random(35)
    alphabet = "ab_1"
    for _ in range(2_000):
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(0, 6))]
        data = " ".join(words).encode()
        text = identifiers(data)
        names = set(text.split())
        assert text == " " + " ".join(dict.fromkeys(text.split())) + " "  # each once, between single spaces
        asks = ["", " ", "ab", "a b", "  ", *words, *(w[1:] for w in words), *(w + " " for w in words)]
        asks += [f"{a} {b}" for a, b in zip(words, words[1:])]
        for name in asks:
            assert mentions(text, name) is (name in names), (text, name)


def test_a_file_found_to_mention_none_of_a_rounds_names_is_answered_as_if_asked_afresh():
    """``wants_file``'s ``none_of`` (kept across the rounds): a later round
    answers every file as a round asked without it would, whether its names
    are among an earlier round's (no split) or not (random rounds, files and
    names; the same wanted names repeat, grow and shrink)."""
    rng = random.Random(36)
    pool = [f"name{i}" for i in range(40)]
    paths = [f"pkg/m{i}.py" for i in range(30)] + [f"csrc/k{i}.cu" for i in range(30)]
    texts = {p: said(*rng.sample(pool, rng.randint(0, 8))) for p in paths}
    for _ in range(40):
        none_of: dict[str, frozenset[str]] = {}
        previous: list[str] = rng.sample(pool, 6)
        for _round in range(4):
            names = rng.choice([previous, rng.sample(previous, 3), previous + rng.sample(pool, 2)])
            previous = names
            table = {n: (frozenset({"pkg"}), frozenset({"pkg"})) for n in names[:3]}
            wants = WantedFiles(definitions=frozenset(names[3:5]), classes=table,
                                modules=frozenset({"pkg.m0"}), native_mentions=frozenset(names[5:]))
            for p in paths:
                if p.endswith(".py"):  # a Python file that mentions a class it can reach is wanted without a look
                    assert wants.wants_file(p, texts[p], never_read, none_of) == \
                        wants.wants_file(p, texts[p], never_read)
                else:
                    look = reads("void name1(int n) {\n}\n")
                    assert wants.wants_file(p, texts[p], look, none_of) == wants.wants_file(p, texts[p], look)
