"""`alloc-audit record`: run a program with PyTorch's memory history on (``record.py``)."""

from __future__ import annotations


def record(args: list[str]) -> int:
    """Run a program with PyTorch's memory history on and dump snapshots for `join` (needs torch).

    Options before `--` are the recorder's (--out DIR, --max-entries N,
    --stacks python|all); after it, the program.

    Example:

      alloc-audit record --out snaps -- python serve.py --steps 16
    """
    from ..record import main

    return main(args)
