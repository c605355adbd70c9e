"""The process boundary: the console script ``alloc-audit`` and
``python -m alloc_audit``. ``cli.py`` chooses exit codes 0, 1, 2 and 130;
an exception that escapes it is alloc-audit's own bug, and exits 3."""

from __future__ import annotations

import gc
import sys

import typer

from .cli import app
from .errors import INTERNAL_ERROR, internal_error_message


def entry() -> None:
    """Console-script entry point: an exception that escapes a command is
    our bug, and exits INTERNAL_ERROR (3) so CI can tell a broken tool from
    a failing check (1) or a usage error (2)."""
    # A scan keeps millions of small objects (the facts, the index) and
    # frees few; the default thresholds (700 allocations) ran ~2,000
    # collections over that heap, about a seventh of the process's CPU on a
    # large tree (issue 11). Collections are only deferred: what refcounts
    # free is still freed at once. At 300,000 more of the young objects are
    # freed by their counts before a collection sees them, and the
    # generation-1 collections over the freshly built index (0.4-0.8 s of the
    # parent's CPU on flashinfer at 100,000) find it already promoted.
    gc.set_threshold(300_000, 20, 10)
    try:
        app(prog_name="alloc-audit")
    except Exception as exc:  # the process boundary; KeyboardInterrupt is handled in cli._guard
        if "--debug" in sys.argv[1:]:
            import traceback

            traceback.print_exc()
        typer.echo(internal_error_message(exc), err=True)
        sys.exit(INTERNAL_ERROR)
    finally:
        # the interpreter's exit runs one full collection over every object
        # still alive (0.75 s after a scan of flashinfer); frozen, it skips them
        gc.freeze()


if __name__ == "__main__":
    entry()
