"""Parent work done by a forked child while the parent goes on (issue 15,
parallel parent work): the rules read the settled index and nothing the
tier passes compute, so a child forked when the index settles runs them
while the parent runs the tier passes.

With more than one job, on a platform that can fork, the child computes
it. With one job the parent computes it at once, where the child would have
been forked: the rules start from the same index (its memos as they were
when it settled) for every ``--jobs``, so the output is the same, and one
job pays for no fork (a fork of a large process and the copy-on-write of
every page the child touches cost more than the rules of a small project).
Where processes cannot be forked, or the child dies, the parent computes
the value itself when it is asked for it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

LOG = logging.getLogger("alloc_audit")

T = TypeVar("T")


class Background(Generic[T]):
    """A value being computed: by a forked child when ``concurrent`` and
    possible, at once otherwise; ``result`` waits for it."""

    def __init__(self, compute: Callable[[], T], concurrent: bool) -> None:
        self._compute = compute
        self._child: Any = None
        self._reader: Any = None
        self._done = False
        self._value: T | None = None
        if not concurrent:
            self.result()
        elif can_fork():
            self._start()

    def _start(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._reader, writer = context.Pipe(duplex=False)
        # what the parent has buffered must not be written again by the child on its way out
        sys.stdout.flush()
        sys.stderr.flush()
        self._child = context.Process(target=_run_child, args=(self._compute, writer), daemon=True)
        self._child.start()
        writer.close()

    def result(self) -> T:
        if not self._done:
            self._value = self._receive() if self._child is not None else self._compute()
            self._done = True
        return self._value  # type: ignore[return-value]  # set above, may be None when T allows it

    def _receive(self) -> T:
        try:
            ok, value = self._reader.recv()
        except (EOFError, OSError):
            ok, value = False, "the child process died"
        finally:
            self._reader.close()
            self._child.join()
        if ok:
            return value  # type: ignore[no-any-return]
        # an internal error in the child (or its death): computed here, so a bug raises as it would without a child
        LOG.debug("background work failed in its child (%s); computed in the parent", value)
        return self._compute()


def _run_child(compute: Callable[[], Any], writer: Any) -> None:
    try:
        payload: tuple[bool, Any] = (True, compute())
    except Exception as exc:  # the parent computes it again and raises it itself
        payload = (False, f"{type(exc).__name__}: {exc}")
    try:
        writer.send(payload)
    except Exception as exc:  # a value that cannot be pickled: the parent computes it
        writer.send((False, f"cannot send the value ({type(exc).__name__}: {exc})"))
    finally:
        writer.close()


def can_fork() -> bool:
    return sys.platform.startswith("linux")
