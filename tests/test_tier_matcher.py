"""pipeline/classify.py: ``TierMatcher.named``/``role_only`` find a pattern's
place by identity (``list.index`` compared the patterns field by field for
every site); the answers are those of ``list.index``, duplicates included."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from alloc_audit.catalog import TierPattern, load_catalog
from alloc_audit.config import find_project, load_config
from alloc_audit.pipeline.classify import TierMatcher


def _index_answers(m: TierMatcher, p: TierPattern) -> tuple[bool, bool]:
    i = m.patterns.index(p)
    return m.by_name[i], m.by_role[i]


def test_named_and_role_only_are_those_of_list_index(tmp_path: Path) -> None:
    shipped = list(load_catalog(load_config(*find_project(tmp_path))).tiers)
    assert shipped
    # an equal copy later in the list and the same object twice answer as the first equal one
    patterns = shipped + [dataclasses.replace(shipped[0]), shipped[1]]
    m = TierMatcher(patterns)
    for p in patterns + [dataclasses.replace(p) for p in shipped]:
        assert (m.named(p), m.role_only(p)) == _index_answers(m, p)
