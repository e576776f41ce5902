"""summary.json's rank sets: lists up to 64 ranks, strings of ranges past them; per-rank maps
grouped by value. Every form written reads back to the same ranks, schema 1's lists and rank ->
value maps included; anything else is refused."""

from __future__ import annotations

import json
import random

import pytest

from lightning_ncclx.analysis.rank_sets import (LIST_MAX_RANKS, MAX_DECODED, decode, encode, group, rank_map,
                                                ranges_text, ungroup, uses_ranges)


@pytest.mark.parametrize("ranks, text", [
    ((), ""), ((7,), "7"), ((0, 1, 2, 5), "0-2,5"), ((3, 4), "3-4"),
    (tuple(r for r in range(16384) if r != 5466), "0-5465,5467-16383"),
    ((9, 1, 2, 2, 0), "0-2,9"),
])
def test_ranges_text(ranks: tuple[int, ...], text: str) -> None:
    assert ranges_text(ranks) == text
    assert decode(text) == tuple(sorted(set(ranks)))


def test_round_trip_through_json_in_both_forms() -> None:
    rng = random.Random(7)
    for _ in range(200):
        ranks = sorted(rng.sample(range(20000), rng.randrange(0, 300)))
        for ranges in (False, True):
            written = json.loads(json.dumps(encode(ranks, ranges)))
            assert decode(written) == tuple(ranks)
            assert isinstance(written, str) is ranges


def test_small_jobs_write_lists_large_ones_ranges() -> None:
    assert not uses_ranges(LIST_MAX_RANKS) and uses_ranges(LIST_MAX_RANKS + 1)
    assert encode([0, 1, 2], uses_ranges(3)) == [0, 1, 2]
    assert encode(range(100), uses_ranges(100)) == "0-99"


@pytest.mark.parametrize("bad", [
    "1-", "-1", "a", "1,,2", "3-1", "5,2", "2,2", "1-3,3", "١", " 1", "1.5", 3, None, {"0": 1}, [1, "2"], [-1],
    [True], "0-99999999999",
])
def test_anything_else_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        decode(bad)


def test_a_forged_range_costs_nothing() -> None:
    with pytest.raises(ValueError, match="more than"):
        decode(f"0-{MAX_DECODED}")
    assert len(decode(f"0-{MAX_DECODED - 1}")) == MAX_DECODED


def test_a_per_rank_map_is_grouped_by_value_and_back() -> None:
    hosts = {r: f"node-{r // 8:05d}" for r in range(100) if r != 13}
    grouped = group(hosts, ranges=True)
    assert list(grouped)[:2] == ["node-00000", "node-00001"] and grouped["node-00001"] == "8-12,14-15"
    assert ungroup(json.loads(json.dumps(grouped))) == hosts
    assert group({2: 41, 0: 41, 1: 40}, ranges=False) == {"41": [0, 2], "40": [1]}


def test_rank_map_reads_schema_2_and_schema_1() -> None:
    assert rank_map({"host_ranks": {"a": "0-1", "b": [2]}}, "host_ranks", "hosts") == {0: "a", 1: "a", 2: "b"}
    assert rank_map({"hosts": {"0": "a", "2": "b"}}, "host_ranks", "hosts") == {0: "a", 2: "b"}
    assert rank_map({}, "host_ranks", "hosts") == {}
    for bad in ({"hosts": {"1": 3}}, {"hosts": {"x": "a"}}, {"hosts": ["a"]}, {"host_ranks": {"a": "1-"}},
                {"host_ranks": ["a"]}):
        with pytest.raises(ValueError):
            rank_map(bad, "host_ranks", "hosts")
