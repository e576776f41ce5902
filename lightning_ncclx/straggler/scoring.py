"""Scores of one interval and the episodes they make: pure functions and a small state machine.

A rank's score is its work (data fetch + forward + optimizer, medians over the interval) over
the median of its peers' work. The median of the *peers* (not of all ranks) keeps one slow rank
from pulling the reference up, and a per-interval median per part ignores a single slow batch.

Peers may wait for a straggler inside a scored part (FSDP all-gathers parameters in forward):
where a rank took less time than *every* peer, the peers spent that difference waiting for it,
so it is taken off their work before the ratio. The slow part is the one with the largest excess
over the peers' median of that part.

The work every rank shares dilutes the ratio of the whole: a forward 30% slower in a step that
also loads, steps the optimizer and runs Lightning's hooks scored 1.17. So a part that is a real
share of the work (at least ``MIN_PART_SHARE`` of the peers' median work) is also scored alone,
and the rank's score is the larger of the two. A part too small to matter (a 1 ms data fetch)
is never scored alone: its ratio is noise. Nor is a part of a rank whose whole work is like its
peers' (``MIN_WORK_RATIO_FOR_PARTS``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from lightning_ncclx.straggler.timings import SCORED_PARTS, IntervalSummary

from lightning_ncclx.report.stragglers import PART_LABELS

MIN_PART_SHARE = 0.25
MIN_WORK_RATIO_FOR_PARTS = 1.05
"""A part is scored alone only where the rank's whole work is above its peers' too: a part that
is long only because the rank waited in it for another rank (FSDP's all-gather in forward, with
the straggler among so few peers that it pulls their median down) is not a straggler's part."""

@dataclass(frozen=True)
class RankScore:
    rank: int
    host: str
    score: float
    """Work over the median of the peers' work, net of their waiting for this rank (1.0: like the
    others), or a large part's own ratio where that is higher."""
    slow_part: str
    """The scored part with the largest excess over the peers' median of it."""
    part_ratios: dict[str, float]
    parts: dict[str, float]
    peer_medians: dict[str, float]


@dataclass(frozen=True)
class IntervalScores:
    interval: int
    ranks: tuple[RankScore, ...]
    """Every rank that reported, slowest first."""

    @property
    def slowest(self) -> RankScore | None:
        return self.ranks[0] if self.ranks else None


def _ratio(value: float, reference: float) -> float:
    if reference > 0:
        return value / reference
    return 1.0 if value <= 0 else float("inf")


def score_interval(summaries: list[IntervalSummary]) -> IntervalScores | None:
    """Score every rank against its peers; None with fewer than two ranks (no peers to compare)."""
    if len(summaries) < 2:
        return None
    interval = summaries[0].interval
    scores = []
    for me in summaries:
        peers = [s for s in summaries if s.rank != me.rank]
        peer_work = statistics.median(s.work_seconds for s in peers)
        waited = {p: max(0.0, min(s.parts.get(p, 0.0) for s in peers) - me.parts.get(p, 0.0)) for p in SCORED_PARTS}
        waited_for_me = sum(waited.values())
        reference = peer_work - waited_for_me if peer_work - waited_for_me > 0 else peer_work
        medians = {p: statistics.median(s.parts.get(p, 0.0) for s in peers) for p in me.parts}
        ratios = {p: _ratio(me.parts[p], medians[p]) for p in me.parts}
        slow = max(SCORED_PARTS, key=lambda p: me.parts.get(p, 0.0) - medians.get(p, 0.0))
        score = _ratio(me.work_seconds, reference)
        for p in SCORED_PARTS if score >= MIN_WORK_RATIO_FOR_PARTS else ():
            median = medians.get(p, 0.0)
            if peer_work > 0 and median >= MIN_PART_SHARE * peer_work:
                part_reference = median - waited[p] if median - waited[p] > 0 else median
                score = max(score, _ratio(me.parts.get(p, 0.0), part_reference))
        scores.append(RankScore(rank=me.rank, host=me.host, score=score, slow_part=slow,
                                part_ratios=ratios, parts=dict(me.parts), peer_medians=medians))
    scores.sort(key=lambda s: (-s.score, s.rank))
    return IntervalScores(interval=interval, ranks=tuple(scores))


@dataclass
class StragglerEpisode:
    """One rank slow for a run of intervals: opened after ``patience`` intervals above the
    threshold (warned once), closed after as many below. Not an ``incident``: that word is a
    hang event in ``lightning-ncclx history``."""

    rank: int
    host: str
    part: str
    first_interval: int
    last_interval: int
    score_max: float
    part_ratio: float
    message: str
    opened_interval: int
    """The interval whose score completed ``patience`` (when the warning was given)."""
    open: bool = True

    def to_json(self) -> dict[str, object]:
        return {"rank": self.rank, "host": self.host, "part": self.part, "first_interval": self.first_interval,
                "last_interval": self.last_interval, "score_max": round(self.score_max, 4),
                "part_ratio": round(self.part_ratio, 4), "opened_interval": self.opened_interval, "open": self.open,
                "message": self.message}


def describe(score: RankScore, intervals: int, interval_steps: int) -> str:
    """``rank 5 on gpu-12: forward 1.31x the median for 3 intervals (...); data fetch normal``."""
    part = score.slow_part
    ratio = score.part_ratios.get(part, 1.0)
    excess = score.parts.get(part, 0.0) - score.peer_medians.get(part, 0.0)
    head = (f"rank {score.rank} on {score.host}: {PART_LABELS[part]} {ratio:.2f}x the median "
            f"for {intervals} interval{'s' if intervals != 1 else ''} ({score.parts.get(part, 0.0) * 1e3:.1f} ms vs "
            f"{score.peer_medians.get(part, 0.0) * 1e3:.1f} ms per batch; score {score.score:.2f}, "
            f"intervals of {interval_steps} batches)")
    normal, slow_too = [], []
    for p in SCORED_PARTS:
        if p == part:
            continue
        # "normal": close to the peers, or an excess that is small next to the slow part's
        other_excess = score.parts.get(p, 0.0) - score.peer_medians.get(p, 0.0)
        if score.part_ratios.get(p, 1.0) < 1.1 or other_excess < 0.1 * excess:
            normal.append(PART_LABELS[p])
        else:
            slow_too.append(f"{PART_LABELS[p]} {score.part_ratios.get(p, 1.0):.2f}x")
    tail = ([f"{', '.join(normal)} normal"] if normal else []) + ([f"also {', '.join(slow_too)}"] if slow_too else [])
    return head + "".join(f"; {t}" for t in tail)


@dataclass
class EpisodeTracker:
    """Opens an episode after ``patience`` intervals above ``threshold``, closes it after as many
    below; each episode is reported once."""

    threshold: float
    patience: int
    interval_steps: int
    episodes: list[StragglerEpisode] = field(default_factory=list)
    _above: dict[int, int] = field(default_factory=dict)
    _below: dict[int, int] = field(default_factory=dict)
    _open: dict[int, StragglerEpisode] = field(default_factory=dict)

    def update(self, scores: IntervalScores) -> tuple[list[StragglerEpisode], list[StragglerEpisode]]:
        """Feed one interval; returns (episodes opened, episodes closed) by it."""
        opened, closed = [], []
        for s in scores.ranks:
            if s.score > self.threshold:
                self._above[s.rank] = self._above.get(s.rank, 0) + 1
                self._below[s.rank] = 0
                episode = self._open.get(s.rank)
                if episode is not None:
                    episode.last_interval = scores.interval
                    episode.score_max = max(episode.score_max, s.score)
                elif self._above[s.rank] >= self.patience:
                    episode = StragglerEpisode(rank=s.rank, host=s.host, part=s.slow_part,
                                               first_interval=scores.interval - self._above[s.rank] + 1,
                                               last_interval=scores.interval, score_max=s.score,
                                               part_ratio=s.part_ratios.get(s.slow_part, 1.0),
                                               message=describe(s, self._above[s.rank], self.interval_steps),
                                               opened_interval=scores.interval)
                    self._open[s.rank] = episode
                    self.episodes.append(episode)
                    opened.append(episode)
            else:
                self._above[s.rank] = 0
                self._below[s.rank] = self._below.get(s.rank, 0) + 1
                episode = self._open.get(s.rank)
                if episode is not None and self._below[s.rank] >= self.patience:
                    episode.open = False
                    del self._open[s.rank]
                    closed.append(episode)
        return opened, closed

    @property
    def open_episodes(self) -> list[StragglerEpisode]:
        return list(self._open.values())
