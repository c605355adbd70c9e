"""perf-r34b: the Python extractor reads fields by id (``common.field_ids``)
instead of by name; on every node of the Python fixtures, each field the
extractor reads by id must give the node that reading it by name gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from alloc_audit.model import Language
from alloc_audit.pipeline.extract import common
from alloc_audit.pipeline.parse import parse_source

_READ = ("left", "right", "type", "operator", "consequence", "condition", "body", "name", "parameters", "value",
         "return_type", "superclasses")


def test_field_ids_read_the_named_fields() -> None:
    ids = common.field_ids(Language.PYTHON, *_READ)
    files = [p for p in sorted((Path(__file__).parent / "fixtures").rglob("*.py")) if p.stat().st_size < 8000][:40]
    assert files
    seen = 0
    for path in files:
        stack = [parse_source(path.read_bytes(), Language.PYTHON).tree.root_node]
        while stack:
            node = stack.pop()
            for name, field in zip(_READ, ids, strict=True):
                assert node.child_by_field_id(field) == node.child_by_field_name(name), (path, node, name)
                seen += node.child_by_field_name(name) is not None
            stack.extend(node.children)
    assert seen > 1000


def test_field_ids_refuse_an_unknown_field() -> None:
    with pytest.raises(KeyError):
        common.field_ids(Language.PYTHON, "no_such_field")
