"""The allowlist format and comparison, as pure functions (property tests
with hypothesis for the format)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alloc_audit.errors import UsageError
from alloc_audit.model import Language, Site, SiteKind, Span, Tier
from alloc_audit.ratchet.allowlist import AllowlistEntry, merge_entries, parse_allowlist, render_file
from alloc_audit.ratchet.compare import compare, plan_update
from alloc_audit.ratchet.gate import compare_allowlists

segment = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                  min_size=1, max_size=12).filter(lambda s: s.strip() == s and s)
tiers = st.sampled_from(["T1", "T2", "T3", "T4", "T5a", "T5b", "unknown"])
reasons = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="\x85"),
                  max_size=30).map(lambda s: " ".join(s.split()))
entry = st.builds(AllowlistEntry, segment, segment, segment, st.integers(1, 50), tiers, st.booleans(), reasons)


def unique(entries: list[AllowlistEntry]) -> list[AllowlistEntry]:
    seen: dict[tuple[str, str, str], AllowlistEntry] = {}
    for e in entries:
        seen.setdefault(e.key, e)
    return list(seen.values())


def strip(e: AllowlistEntry) -> tuple[object, ...]:
    return (e.path, e.scope, e.api, e.count, e.tier, e.pinned, e.reason)


@settings(max_examples=100, deadline=None)
@given(st.lists(entry, max_size=20).map(unique))
def test_parse_of_write_is_identity_and_sorted(entries: list[AllowlistEntry]) -> None:
    text = render_file(entries)
    parsed = parse_allowlist(text, "a.allowlist")
    assert [strip(e) for e in parsed] == sorted((strip(e) for e in entries), key=lambda t: t[:3])
    assert render_file(parsed) == text


def site(path: str, scope: str, api: str, line: int, tier: Tier = Tier.T2) -> Site:
    return Site(path=path, span=Span(line, 1, line, 10), language=Language.PYTHON, api=api, kind=SiteKind.DEVICE,
                scope=scope, tier=tier)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a.py", "b.py"]), st.sampled_from(["f", "C.g"]),
                          st.sampled_from(["torch.empty", "torch.zeros"])), max_size=12),
       st.lists(entry, max_size=6).map(unique))
def test_update_is_idempotent(keys: list[tuple[str, str, str]], existing: list[AllowlistEntry]) -> None:
    sites = [site(p, s, a, i + 1) for i, (p, s, a) in enumerate(keys)]
    scanned = {"a.py", "b.py"}
    first = plan_update(compare(sites, existing, scanned), add_new=True)
    second = plan_update(compare(sites, list(first.entries), scanned), add_new=True)
    assert [strip(e) for e in second.entries] == [strip(e) for e in first.entries]
    assert not second.changed


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param("a.py f torch.empty", "got 3 fields", id="too few fields"),
        pytest.param("a.py f torch.empty x0 T2", "bad count", id="zero count"),
        pytest.param("a.py f torch.empty 3 T2", "bad count", id="count without x"),
        pytest.param("a.py f torch.empty T7", "unknown tier 'T7'", id="unknown tier"),
        pytest.param("a.py f torch.empty x2 T2 extra", "got 6 fields", id="too many fields"),
    ],
)
def test_malformed_lines_name_the_line(line: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_allowlist(f"# alloc-audit allowlist v1\n\n{line}\n", "x.allowlist")
    assert err.value.line == 3 and message in err.value.message


def test_newer_format_version_is_refused() -> None:
    with pytest.raises(UsageError, match="newer than this alloc-audit"):
        parse_allowlist("# alloc-audit allowlist v9\n", "x.allowlist")


def test_spaces_and_hashes_in_fields_round_trip() -> None:
    e = AllowlistEntry("src/my file.cc", "ns::Foo::operator new", "cudaMalloc", 1, "T2", False, "why # not")
    line = e.render()
    assert line == "src/my%20file.cc ns::Foo::operator%20new cudaMalloc T2 # why # not"
    assert strip(parse_allowlist(line, "x")[0]) == strip(e)


def test_pins_survive_and_reasons_are_kept() -> None:
    pinned = AllowlistEntry("a.py", "f", "torch.empty", 1, "T3", True, "pool slab")
    comparison = compare([site("a.py", "f", "torch.empty", 3, Tier.T4)], [pinned], {"a.py"})
    plan = plan_update(comparison, add_new=False)
    assert strip(plan.entries[0]) == strip(pinned)


def test_counts_are_per_scope_so_a_fix_elsewhere_does_not_absorb_a_new_site() -> None:
    entries = [AllowlistEntry("a.py", "f", "torch.empty", 1, "T4"), AllowlistEntry("a.py", "g", "torch.empty", 1, "T4")]
    # f's site was fixed, g gained one: a per-file count would see 2 == 2
    comparison = compare([site("a.py", "g", "torch.empty", 3), site("a.py", "g", "torch.empty", 4)], entries, {"a.py"})
    assert [e.key for e, _ in comparison.grown] == [("a.py", "g", "torch.empty")]
    assert [e.key for e in comparison.stale] == [("a.py", "f", "torch.empty")]


def test_gate_treats_a_rename_as_a_move() -> None:
    base = [AllowlistEntry("old.py", "f", "torch.empty", 2, "T4")]
    now = [AllowlistEntry("new.py", "f", "torch.empty", 2, "T4"), AllowlistEntry("new.py", "g", "torch.zeros", 1, "T4")]
    result = compare_allowlists(base, now)
    assert [m[1].path for m in result.moved] == ["new.py"]
    assert [g.entry.key for g in result.grown] == [("new.py", "g", "torch.zeros")]


@pytest.mark.parametrize(
    ("ours", "theirs", "merged"),
    [
        pytest.param(2, 1, 1, id="smaller count wins"),
        pytest.param(None, 2, None, id="deleted on one side stays deleted"),
        pytest.param(1, None, None, id="deleted on the other side stays deleted"),
    ],
)
def test_merge_is_fail_closed(ours: int | None, theirs: int | None, merged: int | None) -> None:
    base = [AllowlistEntry("a.py", "f", "torch.empty", 2, "T4")]
    side = lambda n: [AllowlistEntry("a.py", "f", "torch.empty", n, "T4")] if n else []  # noqa: E731
    result = merge_entries(base, side(ours), side(theirs))
    assert [e.count for e in result] == ([merged] if merged else [])


def test_merge_keeps_entries_added_on_one_side_and_both_reasons() -> None:
    base: list[AllowlistEntry] = []
    ours = [AllowlistEntry("a.py", "f", "torch.empty", 2, "T4", reason="ours")]
    theirs = [AllowlistEntry("a.py", "f", "torch.empty", 3, "T4", reason="theirs")]
    (merged,) = merge_entries(base, ours, theirs)
    assert merged.count == 2 and merged.reason == "ours; theirs"
