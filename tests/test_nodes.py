"""pipeline/extract/common.py: ``Ancestry`` gives the same parents as tree-sitter's
``Node.parent`` without walking down from the root for every node, so an
``else if`` chain of n branches costs O(n), not O(n^2) (issue 14, item 9)."""

from __future__ import annotations

from typing import Any

import pytest

from alloc_audit.model import Language
from alloc_audit.pipeline.extract.common import Ancestry
from alloc_audit.pipeline.parse import parse_source


def chain(n: int, lang: Language) -> bytes:
    if lang is Language.PYTHON:
        return ("def f(x):\n    if x == 0:\n        g(0)\n"
                + "".join(f"    elif x == {i}:\n        g({i})\n" for i in range(1, n))).encode()
    return ("void f(int x) {\n  if (x == 0) { g(0); }\n"
            + "".join(f"  else if (x == {i}) {{ g({i}); }}\n" for i in range(1, n)) + "}\n").encode()


def calls_in_order(root: Any) -> list[Any]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        if node.type in ("call", "call_expression"):
            out.append(node)
        stack.extend(reversed(node.children))
    return out


@pytest.mark.parametrize("lang", [pytest.param(Language.PYTHON, id="elif"), pytest.param(Language.CUDA, id="else if")])
def test_parents_match_tree_sitter_and_walking_up_is_linear(lang: Language) -> None:
    n = 400
    tree = parse_source(chain(n, lang), lang).tree
    calls = calls_in_order(tree.root_node)
    assert len(calls) == n
    up = Ancestry(tree.root_node)
    for call in calls:  # a few levels up from each site, as the extractors ask
        node = call
        for _level in range(4):
            expected = node.parent
            assert up.parent(node) == expected
            node = expected
    # walking down from the root for every call would take ~n*n/2 steps here
    assert up.steps < 40 * n


def test_parents_up_to_the_root() -> None:
    tree = parse_source(chain(30, Language.CUDA), Language.CUDA).tree
    up = Ancestry(tree.root_node)
    for call in calls_in_order(tree.root_node):
        node = call
        while node is not None:
            assert up.parent(node) == node.parent
            node = node.parent


def test_parents_asked_out_of_order_are_still_right() -> None:
    tree = parse_source(chain(50, Language.CUDA), Language.CUDA).tree
    up = Ancestry(tree.root_node)
    for call in reversed(calls_in_order(tree.root_node)):
        assert up.parent(call) == call.parent


@pytest.mark.parametrize("lang", [pytest.param(Language.PYTHON, id="python"), pytest.param(Language.CUDA, id="cuda")])
def test_ancestors_are_the_parents_up_to_the_root_in_any_order(lang: Language) -> None:
    """``ancestors`` (what ``dead_code.after_exit`` walks for every site)
    reads the chain off the kept path: the same nodes as tree-sitter's
    ``Node.parent`` asked again and again, whatever was asked before."""
    tree = parse_source(chain(40, lang), lang).tree
    calls = calls_in_order(tree.root_node)
    nodes = calls + [c.children[0] for c in calls] + [tree.root_node]
    for order in (nodes, list(reversed(nodes)), nodes[::3] + nodes[1::3] + nodes[2::3]):
        up = Ancestry(tree.root_node)
        for node in order:
            expected, at = [], node.parent
            while at is not None:
                expected.append(at)
                at = at.parent
            assert up.ancestors(node) == expected
