"""``move_apis.without_moves``, the one place the move passes drop direct
Python moves they prove copy nothing: only direct Python sites of the named
APIs are asked about and can go; derived and native sites, and other APIs,
stay, in their order."""

from __future__ import annotations

from alloc_audit.model import Language, Site, SiteKind, Span, Tier, Via
from alloc_audit.pipeline.move_apis import MODULE_MOVES, TENSOR_MOVES, without_moves


def site(line: int, api: str, via: Via | None = None, language: Language = Language.PYTHON) -> Site:
    return Site(path="pkg/m.py", span=Span(line, 1, line, 9), language=language, api=api,
                kind=SiteKind.DEVICE, scope="f", tier=Tier.T4, via=via)


SITES = [
    site(1, "Tensor.to"),
    site(2, "Module.to"),
    site(3, "Tensor.to", via=Via("torch.zeros", "pkg/m.py", 9)),
    site(4, "Tensor.cuda", language=Language.CUDA),
    site(5, "torch.empty"),
    site(6, "Tensor.cuda"),
]


def test_drops_only_direct_python_moves_of_the_apis_it_names() -> None:
    asked: list[int] = []

    def moves_nothing(s: Site) -> bool:
        asked.append(s.span.line)
        return True

    kept = without_moves(SITES, TENSOR_MOVES, moves_nothing)
    assert [s.span.line for s in kept] == [2, 3, 4, 5]
    assert asked == [1, 6]


def test_keeps_what_the_proof_does_not_cover() -> None:
    kept = without_moves(SITES, MODULE_MOVES | TENSOR_MOVES, lambda s: s.span.line == 2)
    assert [s.span.line for s in kept] == [1, 3, 4, 5, 6]
