"""Scores against the median of the peers, the slow part, episodes opened once and closed."""

from __future__ import annotations

import pytest

from lightning_ncclx.straggler.scoring import EpisodeTracker, describe, score_interval
from lightning_ncclx.straggler.timings import IntervalSummary


def summary(rank: int, forward: float = 0.100, data: float = 0.002, optimizer: float = 0.001,
            backward: float = 0.030, interval: int = 0) -> IntervalSummary:
    return IntervalSummary(rank=rank, interval=interval, host=f"node{rank // 2}", batches=10,
                           parts={"data_fetch": data, "forward": forward, "backward": backward, "optimizer": optimizer})


def test_slow_forward_scores_against_the_median_of_the_peers() -> None:
    scores = score_interval([summary(0), summary(1), summary(2, forward=0.131), summary(3)])
    assert scores is not None
    top = scores.slowest
    assert top is not None and top.rank == 2 and top.slow_part == "forward"
    assert top.score == pytest.approx(1.31)  # forward alone: above the whole work's 0.134 / 0.103
    assert top.part_ratios["forward"] == pytest.approx(1.31)
    assert all(s.score == pytest.approx(1.0) for s in scores.ranks[1:])


def test_a_large_part_is_scored_alone_where_shared_work_dilutes_the_whole() -> None:
    # forward 30% slower; loading and the optimizer (shared by every rank) take 40% of the work
    parts = {"data": 0.05, "optimizer": 0.09}
    scores = score_interval([summary(0, **parts, forward=0.2), summary(1, **parts, forward=0.2),
                             summary(2, **parts, forward=0.26), summary(3, **parts, forward=0.2)])
    assert scores is not None
    top = scores.slowest
    assert (top.rank, top.slow_part) == (2, "forward")
    assert (0.4 / 0.34) < 1.2 < top.score == pytest.approx(1.3)


def test_a_small_part_is_never_scored_alone() -> None:
    # a 6 ms data fetch 3x its peers' 2 ms is not scored alone (2% of the work): the whole work decides
    scores = score_interval([summary(0), summary(1), summary(2, data=0.006, forward=0.110), summary(3)])
    assert scores is not None and scores.slowest.score == pytest.approx(0.117 / 0.103)


def test_waiting_in_backward_is_not_scored() -> None:
    # the others wait in the gradient all-reduce: their backward is long, they are not stragglers
    scores = score_interval([summary(0, backward=0.060), summary(1, backward=0.060), summary(2, forward=0.13),
                             summary(3, backward=0.060)])
    assert scores is not None and [s.rank for s in scores.ranks][0] == 2
    assert max(s.score for s in scores.ranks if s.rank != 2) == pytest.approx(1.0)


def test_peers_waiting_inside_forward_are_not_counted_as_their_work() -> None:
    # FSDP-like: the others wait for rank 1's slow loader in their forward's all-gather
    scores = score_interval([summary(0, forward=0.133), summary(1, data=0.032, forward=0.103),
                             summary(2, forward=0.133)])
    assert scores is not None
    top = scores.ranks[0]
    assert (top.rank, top.slow_part) == (1, "data_fetch")
    assert top.score == pytest.approx(0.136 / (0.136 - 0.030))
    assert max(s.score for s in scores.ranks[1:]) < 1.05


def test_slow_loader_is_the_slow_part() -> None:
    scores = score_interval([summary(0), summary(1, data=0.032), summary(2), summary(3)])
    assert scores is not None and scores.ranks[0].rank == 1 and scores.ranks[0].slow_part == "data_fetch"


def test_a_single_rank_has_no_score() -> None:
    assert score_interval([summary(0)]) is None


def test_message_names_rank_host_part_and_normal_parts() -> None:
    scores = score_interval([summary(0), summary(1), summary(2), summary(5, forward=0.131)])
    assert scores is not None
    text = describe(scores.ranks[0], 3, 100)
    assert text.startswith("rank 5 on node2: forward 1.31x the median for 3 intervals (131.0 ms vs 100.0 ms")
    assert text.endswith("data fetch, optimizer normal")


def feed(tracker: EpisodeTracker, slow: list[bool]) -> list[tuple[int, str, str]]:
    events = []
    for i, is_slow in enumerate(slow):
        s = score_interval([summary(0, interval=i), summary(1, interval=i),
                            summary(2, interval=i, forward=0.140 if is_slow else 0.100)])
        assert s is not None
        opened, closed = tracker.update(s)
        events += [(i, "open", x.message) for x in opened] + [(i, "close", x.message) for x in closed]
    return events


def test_episode_opens_after_patience_once_and_closes_after_as_many_below() -> None:
    tracker = EpisodeTracker(threshold=1.2, patience=3, interval_steps=100)
    events = feed(tracker, [True, True, False, True, True, True, True, False, False, False, True])
    assert [(i, kind) for i, kind, _ in events] == [(5, "open"), (9, "close")]
    episode = tracker.episodes[0]
    assert (episode.rank, episode.first_interval, episode.opened_interval, episode.last_interval) == (2, 3, 5, 6)
    assert not episode.open and "for 3 intervals" in episode.message


def test_noise_below_threshold_opens_nothing() -> None:
    tracker = EpisodeTracker(threshold=1.2, patience=1, interval_steps=100)
    for i in range(20):
        s = score_interval([summary(r, interval=i, forward=0.1 * (1 + 0.15 * ((i + r) % 2))) for r in range(4)])
        assert s is not None
        tracker.update(s)
    assert tracker.episodes == []
