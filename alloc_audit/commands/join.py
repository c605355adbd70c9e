"""`alloc-audit join`: memory records of a real run + the census -> a joined
outcome (no printing; ``cli.py`` renders it and picks the exit code).

Records are told apart by their first bytes: a pickle (gzipped or not) is a
PyTorch memory snapshot; text starting with ``{`` is the native recorder's
JSON lines; a compute-sanitizer report is a native leak record. Snapshots
and native records are joined separately: they count different memory.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..model import FileError, FileFacts, Language, ScanResult
from .project import Options, load_project, root_display, scan_project

if TYPE_CHECKING:  # the runtime modules load with the command, not with the CLI
    from ..catalog import Catalog
    from ..config import Config
    from ..runtime.match import Matcher, PathMap
    from ..runtime.results import Join
    from ..runtime.snapshot import Snapshot

SOURCE_SUFFIXES = (".py", ".pyi", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".toml")


@dataclass(frozen=True)
class JoinOutcome:
    snapshot: Join | None  # PyTorch snapshots joined
    native: Join | None  # native records joined
    root_display: str
    errors: tuple[FileError, ...]
    min_accounted: float | None = None

    @property
    def failed(self) -> bool:
        return not self.passed

    @property
    def passed(self) -> bool:
        """The accounted-share gate: every joined record's share >= the minimum."""
        if self.min_accounted is None:
            return True
        return all(j.accounted_share >= self.min_accounted for j in (self.snapshot,) if j is not None)


def split_arguments(args: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """``join SNAPSHOT... [PATHS]``: directories and source files are the
    tree to scan; every other file is a record."""
    records, paths = [], []
    for arg in args:
        if arg.is_dir() or arg.suffix in SOURCE_SUFFIXES:
            paths.append(arg)
        elif arg.is_file():
            records.append(arg)
        else:
            raise UsageError("no such snapshot, record or path", str(arg))
    if not records:
        raise UsageError("name at least one snapshot (a torch.cuda.memory._dump_snapshot pickle) or native record")
    return records, paths


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
            if head[:2] == b"\x1f\x8b":
                fh.seek(0)
                with gzip.GzipFile(fileobj=fh) as gz:
                    return gz.read(4096)
            return head
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        from ..runtime.unpickle import SnapshotError

        raise SnapshotError(f"{path}: cannot read: {exc}") from None


def read_records(records: Sequence[Path], limit: int) -> tuple[list[Snapshot], list[Snapshot]]:
    """Read every record; a bad one is a :class:`UsageError` naming it (exit 2)."""
    from ..runtime.native import is_native_record, read_native
    from ..runtime.snapshot import read_snapshot
    from ..runtime.unpickle import SnapshotError

    snapshots, natives = [], []
    for path in records:
        try:
            if is_native_record(_head(path)):
                natives.append(read_native(path, limit))
            else:
                snapshots.append(read_snapshot(path, limit))
        except SnapshotError as exc:
            raise UsageError(str(exc)) from None
    return snapshots, natives





class FactsLoader:
    """Parses a scanned Python file on demand for its function spans and
    capture regions (a scan answered from the cache keeps no facts)."""

    def __init__(self, root: Path, catalog: Catalog) -> None:
        self.root = root
        self.catalog = catalog

    def __call__(self, path: str) -> FileFacts | None:
        if not path.endswith(".py"):
            return None
        from ..pipeline.extract import extract_facts
        from ..pipeline.parse import parse_source

        try:
            data = (self.root / path).read_bytes()
        except OSError:
            return None
        return extract_facts(path, Language.PYTHON, parse_source(data, Language.PYTHON), self.catalog.apis)


def run_join(result: ScanResult, config: Config, catalog: Catalog, records: Sequence[Path], root_display: str,
             path_maps: Sequence[PathMap] = (), min_accounted: float | None = None,
             limit: int = 1 << 30) -> JoinOutcome:
    from ..runtime.join import join
    from ..runtime.match import ALLOCATOR_KINDS, NATIVE_KINDS, Matcher

    snapshots, natives = read_records(records, limit)
    loader = FactsLoader(config.root, catalog)
    root = str(config.root.resolve())

    def matcher(kinds: frozenset) -> Matcher:  # type: ignore[type-arg]
        return Matcher(result.sites, result.files, result.scanned_paths, root, path_maps, kinds,
                       catalog.pack.capture_contexts, loader)

    joined = join(snapshots, matcher(ALLOCATOR_KINDS), result.sites, result.findings) if snapshots else None
    native = join(natives, matcher(NATIVE_KINDS), result.sites, result.findings, source="native") \
        if natives else None
    return JoinOutcome(joined, native, root_display, result.errors, min_accounted)


def join_records(args: Sequence[Path], options: Options, path_maps: Sequence[str] = (),
                 min_accounted: float | None = None, max_snapshot_mb: int = 1024) -> JoinOutcome:
    """Attribute a real run's GPU memory (a PyTorch memory snapshot) to the census's sites.

    Per site and tier: bytes live at the snapshot, peak, allocations, churn
    per step, lifetimes, bytes allocated under capture; the static tier
    against the observed lifetime; the static findings confirmed or not.
    Records are PyTorch snapshots (torch.cuda.memory._dump_snapshot pickles,
    gzipped or not, read without torch and without running anything) or
    native records (the recorder shim's log, a compute-sanitizer leak
    report). Directories and source files name the tree to scan. Details:
    docs/join.md.

    Examples:

      alloc-audit join snapshot-rank0.pickle.gz src/engine --min-accounted 90

      alloc-audit join snaps/*.pickle.gz . --path-map /app=. -f html -o join.html
    """
    from ..runtime.match import parse_path_map

    try:
        maps = [parse_path_map(m) for m in path_maps]  # --path-map OLD=NEW
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    records, paths = split_arguments(args)
    project = load_project(paths or None, options.config_path)
    result = scan_project(project, paths or None, options)
    return run_join(result, project.config, project.catalog, records, root_display(project.config.root),
                    maps, min_accounted, max_snapshot_mb << 20)
