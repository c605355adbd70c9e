#!/usr/bin/env python3
"""A careful grep for the catalogue's allocation APIs, next to alloc-audit's census.

    python bench/grep_census.py TREE [--top 25]

The grep looks only at code: Python is tokenized (stdlib ``tokenize``, the
code is never run) and comments and string literals are dropped; C++/CUDA
comments and literals are blanked by a small lexer. It counts calls of each
catalogue name (``torch.empty(``, ``cudaMalloc(``, ``at::zeros(``) as written.

Three columns per API:
- grep: the careful grep;
- calls: every call alloc-audit resolved to that API (aliases resolved,
  multi-line calls included), whether or not it allocates device memory;
- sites: alloc-audit's census sites (device, pinned, ... ; host tensors are
  not sites).

grep vs calls is the parser's accuracy (aliases such as ``import torch as
th`` and calls the grep cannot see, or text that only looks like a call);
calls vs sites is the census's judgement (a ``torch.empty`` without a CUDA
device is a host tensor, not a site).
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import floor  # noqa: E402

_CPP_NOISE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def python_code(data: bytes) -> str:
    """The source with comments and strings removed (line structure kept)."""
    out = []
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING, tokenize.ENCODING):
                continue
            if tok.type in (getattr(tokenize, "FSTRING_START", -1), getattr(tokenize, "FSTRING_MIDDLE", -1),
                            getattr(tokenize, "FSTRING_END", -1)):
                continue
            out.append(tok.string)
            out.append("\n" if tok.type in (tokenize.NEWLINE, tokenize.NL) else " ")
    except (tokenize.TokenError, SyntaxError, IndentationError):
        text = data.decode("utf-8", "replace")
        return re.sub(r"#[^\n]*", "", text)
    # tokens are joined with spaces: `torch . empty (` -> normalise
    return re.sub(r"\s*\.\s*", ".", re.sub(r"\s+\(", "(", "".join(out)))


def cpp_code(data: bytes) -> str:
    return _CPP_NOISE.sub(lambda m: " " * (m.end() - m.start()), data.decode("utf-8", "replace"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    root = args.tree.resolve()

    from alloc_audit.catalog import load_catalog
    from alloc_audit.config import find_project, load_config
    from alloc_audit.pipeline import run as pipeline

    config = load_config(*find_project(root))
    catalog = load_catalog(config)
    apis = catalog.apis
    py_names = sorted(apis.py_names)
    cpp_names = sorted(apis.cpp_names)
    py_re = {n: re.compile(r"(?<![\w.])" + re.escape(n) + r"\(") for n in py_names}
    cpp_re = {n: re.compile(r"(?<![\w:.>])(?:::)?(?:std::)?" + re.escape(n) + r"\s*[(<{]") for n in cpp_names}

    grep: Counter[str] = Counter()
    for f in floor.source_files(root):
        data = f.read_bytes()
        if f.suffix == ".py":
            code = python_code(data)
            if "torch" not in code and "cuda" not in code and "cupy" not in code:
                continue
            for name, rx in py_re.items():
                grep[name] += len(rx.findall(code))
        else:
            code = cpp_code(data)
            for name, rx in cpp_re.items():
                grep[name] += len(rx.findall(code))

    result = pipeline.run_scan(config, catalog, pipeline.ScanOptions(use_cache=False))
    calls: Counter[str] = Counter()
    for facts in result.files.values():
        table = facts.calls
        for callee in table.callees:
            if callee in apis.py_names or callee in apis.cpp_names:
                calls[callee] += 1
            elif facts.language.value != "python":
                spec = apis.cpp_lookup(callee)
                if spec is not None:
                    calls[spec.api] += 1
    sites = Counter(s.api for s in result.sites if s.via is None)

    names = sorted(set(grep) | set(sites) | set(calls), key=lambda n: (-max(grep[n], sites[n], calls[n]), n))
    names = [n for n in names if grep[n] or sites[n] or calls[n]]
    total = {k: sum(c[n] for n in names if n in py_re or n in cpp_re) for k, c in
             (("grep", grep), ("calls", calls), ("sites", sites))}
    print(f"{root.name}: {len(result.files)} files analysed of {result.stats.files}")
    print()
    print("| api | grep (code only) | alloc-audit calls | alloc-audit sites |")
    print("|---|--:|--:|--:|")
    for n in names[: args.top]:
        print(f"| `{n}` | {grep[n]} | {calls[n]} | {sites[n]} |")
    print(f"| **catalogue names, total** | **{total['grep']}** | **{total['calls']}** | **{total['sites']}** |")
    other = sum(v for k, v in sites.items() if k not in py_re and k not in cpp_re)
    print()
    print(f"Sites of APIs matched by method or leaf (Tensor.new_*, .cuda(), ctypes cudaMalloc, constructors) that a "
          f"name grep cannot attribute: {other}.")


if __name__ == "__main__":
    main()
