"""Fault-safe writes of the files alloc-audit owns: the allowlist, reports
written with ``-o``, the merge driver's result, annotated sources, the cache.

- ``atomic_write_bytes``: readers see the old or the new content, never a torn
  file (temp file in the same directory, fsync, rename), and a kill at any
  moment leaves at worst a stray ``.NAME.*.tmp`` beside it.
- A path that exists and is not a regular file is never replaced by one: a
  symbolic link is followed and its target written (atomically when the
  target is a regular file or absent); a FIFO, character device or socket
  is written through, as a shell redirection would (``-o /dev/null``,
  ``-o /dev/stdout``, a named pipe); a directory is refused. Replacing
  ``/dev/null`` with a regular file, as a plain rename does for root, breaks
  the whole machine.
- ``locked_directory``: an advisory lock (``flock``) on a directory, held
  while a writer re-reads what it is about to replace and compares it with
  what it planned from (compare-and-swap, see ``ratchet``'s update): two
  concurrent ``allowlist update`` runs then never lose each other's entries.
  The lock is on the directory itself, so no lock file is left in the
  user's tree; where ``flock`` is missing (Windows) it is a no-op.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["NotWritable", "atomic_write_bytes", "locked_directory"]


class NotWritable(OSError):
    """The path exists and cannot be written without replacing what it is
    (a directory)."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` without ever leaving it torn or replacing
    a non-regular file (see the module docstring). Raises OSError."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise NotWritable(21, "is a directory", str(path))
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_through(target, data)
        return
    _replace(target, data, st.st_mode & 0o777 if st is not None else None)


def _write_through(path: Path, data: bytes) -> None:
    """A FIFO or device: open it for writing, as ``>`` does; never unlink it."""
    fd = os.open(path, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def _replace(path: Path, data: bytes, mode: int | None) -> None:
    directory = path.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_directory(directory)


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (a power cut after it keeps the new name)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def locked_directory(directory: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``directory`` (created if needed)
    for the duration of the block; other alloc-audit writers wait."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
