"""Which files of a candidate evaluation tree carry code of the tuning trees.

    python3 bench/tree_overlap.py TREES_DIR CANDIDATE [CANDIDATE ...]

Every line longer than 40 characters (stripped) of every Python and native
file under ``TREES_DIR`` (the folders not named like a candidate's prefix)
is one reference set; a candidate's file of at least 8 such lines whose
share found in that set is above 0.3 is printed as ``share lines path``.
Round 32 removed every file it printed before judging
(``bench/results/judged/removed-r32.txt``) and dropped two trees that were
mostly another tree's code (TidalDecode: Quest; SpargeAttn: SageAttention).
Lines are compared by a 64-bit digest, so the set of ~3.4 M lines fits in
memory."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator

_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".h", ".cc", ".hpp")


def _lines(path: str) -> set[bytes]:
    try:
        with open(path, "rb") as handle:
            return {hashlib.blake2b(line.strip(), digest_size=8).digest()
                    for line in handle if len(line.strip()) > 40}
    except OSError:
        return set()


def _files(root: str) -> Iterator[str]:
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            if name.endswith(_SUFFIXES):
                yield os.path.join(folder, name)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    trees, candidates = argv[0], [c.rstrip("/") for c in argv[1:]]
    prefixes = {os.path.basename(c).split("-")[0] + "-" for c in candidates}
    reference: set[bytes] = set()
    for name in sorted(os.listdir(trees)):
        folder = os.path.join(trees, name)
        if os.path.isdir(folder) and not name.startswith(("_", *prefixes)):
            for path in _files(folder):
                reference |= _lines(path)
    for candidate in candidates:
        for path in sorted(_files(candidate)):
            lines = _lines(path)
            if len(lines) >= 8:
                share = len(lines & reference) / len(lines)
                if share > 0.3:
                    print(f"{share:.2f} {len(lines)} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
