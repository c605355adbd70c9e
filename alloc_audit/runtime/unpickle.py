"""Read a memory snapshot pickle without trusting it.

``torch.cuda.memory._dump_snapshot`` writes a pickle of plain containers, but
a pickle is a program: ``GLOBAL``/``STACK_GLOBAL`` name any importable
callable and ``REDUCE`` calls it. A snapshot comes from another machine, so
it is untrusted input. :class:`PlainUnpickler` refuses every opcode that
names or calls anything (``find_class`` raises, and persistent ids and the
extension registry are refused), so only dicts, lists, tuples, sets, str,
bytes, int, float, bool and None can come out of it. Nothing is imported and
nothing is executed, whatever the file holds.

Size limits keep a hostile or corrupt file from eating the machine: the
compressed and the decompressed size are both capped (``MAX_BYTES``), and a
gzip bomb stops at the cap instead of filling memory.
"""

from __future__ import annotations

import gzip
import io
import pickle
import zlib
from pathlib import Path
from typing import Any

MAX_BYTES = 1 << 30  # 1 GiB of pickle, after decompression

GZIP_MAGIC = b"\x1f\x8b"


class SnapshotError(Exception):
    """The file is not a snapshot we can read; the message names the file."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds plain containers and refuses anything that
    would import or call: the refusal happens when the opcode is read, before
    any object it names could be looked up."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to load {module}.{name}: a snapshot holds plain data only")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses persistent ids: a snapshot holds plain data only")


def read_bytes(path: Path, limit: int = MAX_BYTES) -> bytes:
    """The pickle bytes of ``path``, gunzipped when gzipped, at most ``limit``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head == GZIP_MAGIC:
                with gzip.GzipFile(fileobj=fh) as gz:
                    data = gz.read(limit + 1)
            else:
                data = fh.read(limit + 1)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise SnapshotError(f"{path}: cannot read: {exc}") from None
    if len(data) > limit:
        raise SnapshotError(f"{path}: larger than {limit} bytes unpacked; not read (raise the limit with "
                            f"--max-snapshot-mb)")
    return data


def load_plain(path: Path, limit: int = MAX_BYTES) -> Any:
    """Unpickle ``path`` (gzipped or not) into plain data, or raise
    :class:`SnapshotError` naming the file and the reason."""
    data = read_bytes(path, limit)
    try:
        return PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        if str(exc).startswith("refuses"):
            raise SnapshotError(f"{path}: not a plain-data snapshot: {exc}") from None
        reason = "truncated" if "truncated" in str(exc) else f"malformed ({exc})"
        raise SnapshotError(f"{path}: not a readable snapshot pickle: {reason}") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError, MemoryError,
            RecursionError, UnicodeDecodeError) as exc:
        reason = "truncated" if isinstance(exc, EOFError) else f"malformed ({type(exc).__name__}: {exc})"
        raise SnapshotError(f"{path}: not a readable snapshot pickle: {reason}") from None
