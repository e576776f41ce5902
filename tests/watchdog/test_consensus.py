"""Consensus hang detection: the notices, rank 0's decision, the store traffic and the waits learnt
from recoveries, with several ranks' detectors on one real in-memory c10d store, injected clocks,
probes and sites (no threads)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch.distributed as dist

from lightning_ncclx.events.connection import StoreClient
from lightning_ncclx.events.keys import bell_key

from lightning_ncclx.config import ConfigError, ConsensusConfig, NcclxConfig, WatchdogConfig
from lightning_ncclx.watchdog.collective_probe import BlockedIn, blocked_from_status
from lightning_ncclx.dump.p2p_ops import P2PInFlight
from lightning_ncclx.watchdog.consensus import (
    CHANGES_KEY, RECOVERY_WAIT_FACTOR, Consensus, ConsensusBoard, OverrunNotice, P2PWait, Picture,
    notice_key,
)
from lightning_ncclx.watchdog.heartbeat import Heartbeat, Phase
from support import FakeClock

POLL = 0.5
STEP = 1.0
WAIT = 3.0  # multiplier 3 x the slowest step (1 s), above the 2 s minimum
IN_ALLREDUCE = BlockedIn("gloo", "1", 13)


class CountingStore:
    """A real HashStore that counts the requests each rank's detector sends."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return method(*args, **kwargs)

        return counted


class Job:
    """``world`` ranks, each with a heartbeat, a detector and a probe the test sets."""

    def __init__(self, world: int = 3, **consensus: Any) -> None:
        self.clock = FakeClock(1000.0)
        self.shared = StoreClient(dist.PrefixStore("test", dist.HashStore()))
        config = WatchdogConfig(consensus=ConsensusConfig(**{"warmup_steps": 3, **consensus}))
        self.heartbeats = [Heartbeat(config, clock=self.clock) for _ in range(world)]
        self.stores = [CountingStore(self.shared) for _ in range(world)]
        self.where: dict[int, list[BlockedIn]] = {r: [] for r in range(world)}
        self.p2p: dict[int, list[P2PInFlight]] = {r: [] for r in range(world)}
        self.site: dict[int, str | None] = {r: None for r in range(world)}
        self.main_phase: dict[int, Phase | None] = {r: None for r in range(world)}
        self.cpu_share: dict[int, float] = {r: 0.0 for r in range(world)}
        """Share of a CPU each rank's main thread uses while the clock moves (0: waiting)."""
        self._cpu: dict[int, float] = {r: 0.0 for r in range(world)}
        self.detectors = [
            Consensus(config.consensus, ConsensusBoard(self.stores[r], r, world), self.heartbeats[r],
                      poll_interval_seconds=POLL, clock=self.clock,
                      probe=lambda r=r: list(self.where[r]), p2p_probe=lambda r=r: list(self.p2p[r]),
                      main_thread_phase=lambda r=r: self.main_phase[r], main_thread_cpu=lambda r=r: self._cpu[r],
                      main_thread_site=lambda r=r: self.site[r])
            for r in range(world)
        ]
        self.frozen: set[int] = set()
        """Ranks whose watchdog thread cannot run (GIL held, process stopped): never ticked."""
        for detector in self.detectors:
            detector.board.rings_doorbells = True
            detector.start()

    def counters(self) -> tuple[int, int]:
        """(ranks with a notice, changes so far) as the change log says them."""
        return self.detectors[0].board.counters()

    def rang(self, rank: int) -> bool:
        """Whether rank's bell rang since the last look (its doorbell thread deletes the key)."""
        return bool(self.shared.delete_key(bell_key(rank)))

    def steps(self, n: int, seconds: float = STEP) -> None:
        for _ in range(n):
            for hb in self.heartbeats:
                hb.train_batch_start()
            self.clock.advance(seconds)
            for hb in self.heartbeats:
                hb.train_batch_end()

    def start_step(self) -> None:
        for hb in self.heartbeats:
            hb.train_batch_start()

    def poll(self) -> Picture | None:
        """One poll on every rank, rank 0 last (it decides on what the others posted)."""
        self.clock.advance(POLL)
        for r, share in self.cpu_share.items():
            self._cpu[r] += share * POLL
        for r, detector in enumerate(self.detectors[1:], start=1):
            if r not in self.frozen:
                assert detector.tick(pinged=self.rang(r)) is None
        return self.detectors[0].tick(pinged=self.rang(0))

    def polls_until_hang(self, limit: int = 40) -> tuple[Picture | None, int]:
        for n in range(1, limit + 1):
            picture = self.poll()
            if picture is not None:
                return picture, n
        return None, limit


def test_a_rank_stuck_outside_a_collective_is_a_hang_after_the_wait_and_two_agreeing_polls() -> None:
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})  # rank 1 computes forever
    picture, polls = job.polls_until_hang()
    assert picture is not None
    assert sorted(picture.blocked) == [0, 2] and picture.busy == [1] and picture.silent == []
    # nothing posted before WAIT; notices in the poll after it; rank 0 confirms one poll later
    assert polls == int(WAIT / POLL) + 2
    assert "rank(s) 0, 2 blocked in gloo group 1 op 13" in picture.describe()
    assert "rank(s) 1 outside any collective, waiting" in picture.describe()
    assert job.poll() is None  # one event per picture


def test_a_rank_working_outside_collectives_vetoes_until_it_only_waits() -> None:
    """Rank 0 evaluates in a hook for a long while (its main thread on a CPU) as the others wait
    at a barrier: slow, not stuck. Once its main thread waits too, it is a hang."""
    job = Job()
    job.steps(5)
    job.start_step()
    job.cpu_share[0] = 0.9
    job.where.update({1: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    picture, _ = job.polls_until_hang(limit=30)
    assert picture is None
    assert job.detectors[0].board.posted is not None and job.detectors[0].board.posted.working
    job.cpu_share[0] = 0.0
    picture, polls = job.polls_until_hang(limit=4)
    assert picture is not None and picture.busy == [0] and picture.working == [] and polls == 2


def test_a_working_rank_says_so_in_its_first_notice() -> None:
    """CPU use is sampled at every poll, so rank 0 never confirms a hang on a notice posted
    before the rank knew it was working."""
    job = Job()
    job.steps(5)
    job.start_step()
    job.cpu_share[1] = 0.5
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    for _ in range(int(WAIT / POLL) + 1):
        job.poll()
    assert job.detectors[1].board.posts == 1 and job.detectors[1].board.posted.working


def test_a_blocked_rank_is_never_working() -> None:
    notice = OverrunNotice(rank=0, beat=1, step=1, blocked=(IN_ALLREDUCE,), waited_seconds=3.0, working=True)
    assert Picture(1, {0: notice}).working == [] and Picture(1, {0: notice}).is_hang(0.5)


def _notice(rank: int, *blocked: BlockedIn, working: bool = False, p2p: tuple[P2PWait, ...] = ()) -> OverrunNotice:
    return OverrunNotice(rank=rank, beat=1, step=1, blocked=blocked, waited_seconds=3.0, working=working, p2p=p2p)


def test_a_gloo_collective_the_group_has_moved_past_is_no_wait() -> None:
    """Ranks 0 and 2 wait in op 74 of gloo group 0, so op 73 completed there, with rank 1 in it;
    rank 1's recorder still shows op 73 unfinished (gloo can mark it late): rank 1 is
    outside any collective, and a busy main thread there vetoes as it would anywhere else."""
    late = {0: _notice(0, BlockedIn("gloo", "0", 74)), 1: _notice(1, BlockedIn("gloo", "0", 73)),
            2: _notice(2, BlockedIn("gloo", "0", 74))}
    picture = Picture(3, late)
    assert sorted(picture.blocked) == [0, 2] and picture.busy == [1] and picture.is_hang(0.5)
    assert picture.describe().startswith("rank(s) 0, 2 blocked in gloo group 0 op 74; rank(s) 1 outside any collective")
    working = Picture(3, {**late, 1: _notice(1, BlockedIn("gloo", "0", 73), working=True)})
    assert working.working == [1] and not working.is_hang(0.5)
    recv = P2PWait("gloo", "3", 5, "recv", 1)
    in_recv = Picture(3, {**late, 2: _notice(2, BlockedIn("gloo", "0", 73), p2p=(recv,)),
                          1: _notice(1)})
    assert in_recv.blocked[2] == (recv,) and "rank(s) 2 blocked in recv from rank 1" in in_recv.describe()


@pytest.mark.parametrize("other", [BlockedIn("gloo", "1", 74), BlockedIn("nccl", "0", 74), BlockedIn("nccl2", "0", 74)])
def test_op_numbers_are_compared_only_within_one_gloo_group(other: BlockedIn) -> None:
    """Another group's counter, or an NCCL counter (it counts sends and recvs too, so one rank's op
    number is not another's), says nothing about rank 1's op 73: it still waits there."""
    mine = BlockedIn(other.backend, "0", 73)
    picture = Picture(3, {0: _notice(0, other), 1: _notice(1, mine), 2: _notice(2, other)})
    assert sorted(picture.blocked) == [0, 1, 2] and picture.blocked[1] == (mine,) and picture.busy == []


def test_a_slow_step_that_ends_withdraws_the_notices_and_is_no_hang() -> None:
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    for _ in range(int(WAIT / POLL) + 1):  # every rank has posted; rank 0 waits for its second look
        assert job.poll() is None
    assert job.counters()[0] == 3
    job.steps(1)  # the step ended after all
    job.where.update({0: [], 2: []})
    assert job.poll() is None
    assert job.counters()[0] == 0
    picture, _ = job.polls_until_hang(limit=4)
    assert picture is None


@pytest.mark.parametrize("phase", [Phase.validation, Phase.checkpoint, Phase.epoch_start, Phase.teardown])
def test_a_rank_in_a_phase_that_explains_the_wait_vetoes(phase: Phase) -> None:
    job = Job()
    job.steps(5)
    job.start_step()
    job.heartbeats[1].beat(phase)  # e.g. rank 1 builds a checkpoint while the others wait in its barrier
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    picture, _ = job.polls_until_hang(limit=30)
    assert picture is None
    assert job.detectors[1].board.posted is None


@pytest.mark.parametrize("phase", [Phase.first_step, Phase.checkpoint])
def test_a_rank_whose_main_thread_compiles_or_saves_vetoes(phase: Phase) -> None:
    job = Job()
    job.steps(5)
    job.start_step()
    job.main_phase[2] = phase  # a recompile after a shape change, or a torch.save inside the step
    job.where.update({0: [IN_ALLREDUCE], 1: [IN_ALLREDUCE]})
    picture, _ = job.polls_until_hang(limit=30)
    assert picture is None
    job.main_phase[2] = None  # it was stuck after all: now the picture is complete
    picture, _ = job.polls_until_hang(limit=4)
    assert picture is not None and picture.busy == [2]


def test_nothing_is_posted_before_the_warm_up_steps() -> None:
    job = Job(warmup_steps=10)
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    picture, _ = job.polls_until_hang(limit=30)
    assert picture is None
    assert all(d.probes == 0 for d in job.detectors)


def test_the_wait_follows_the_slowest_step_seen() -> None:
    job = Job(multiplier=3.0, min_wait_seconds=2.0)
    job.steps(4, seconds=0.1)
    assert job.heartbeats[0].consensus_wait() == pytest.approx(2.0)  # the minimum
    job.steps(1, seconds=4.0)
    job.steps(20, seconds=0.1)
    assert job.heartbeats[0].consensus_wait() == pytest.approx(12.0)  # a rare slow step is not forgotten
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    for _ in range(int(12.0 / POLL)):
        assert job.poll() is None
    assert all(d.board.posted is None for d in job.detectors)


def test_every_rank_busy_is_left_to_the_step_threshold() -> None:
    job = Job()
    job.steps(5)
    job.start_step()  # nobody in a collective: a very slow step on every rank, or all stuck alike
    picture, _ = job.polls_until_hang(limit=30)
    assert picture is None
    assert job.counters()[0] == 3


def test_a_rank_whose_watchdog_cannot_run_is_a_hang_once_it_leaves_a_ping_unanswered() -> None:
    """Rank 1's watchdog thread cannot run (GIL held, process stopped): it posts nothing. Once
    ranks 0 and 2 are blocked, rank 0 pings it; no answer for the silence, then one confirming
    poll: a hang that names rank 1 silent."""
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    job.frozen.add(1)
    picture, polls = job.polls_until_hang(limit=30)
    assert picture is not None and picture.unanswered == (1,) and picture.silent == [1]
    assert sorted(picture.blocked) == [0, 2] and picture.busy == []
    silence = job.detectors[0].silence_seconds
    # notices in the poll after WAIT, the ping at once; no notice changed during the silence: no further poll
    assert polls == int(WAIT / POLL) + 1 + int(silence / POLL)
    assert "rank(s) 1 silent" in picture.describe()
    assert job.poll() is None  # one event per picture


def test_when_rank_0_cannot_run_its_watchdog_rank_1_decides() -> None:
    """Rank 0 is the silent rank: rank 1, whose own notice is up, pings it and starts the event."""
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({1: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    job.frozen.add(0)
    picture = None
    for _ in range(30):
        job.clock.advance(POLL)
        picture = job.detectors[2].tick(pinged=job.rang(2)) or job.detectors[1].tick(pinged=job.rang(1))
        if picture is not None:
            break
    assert picture is not None and picture.unanswered == (0,) and sorted(picture.blocked) == [1, 2]


def test_the_deputy_reads_nothing_in_steady_state_and_leaves_other_hangs_to_rank_0() -> None:
    job = Job()
    job.steps(5)
    before = job.stores[1].calls
    for _ in range(10):
        job.start_step()
        job.poll()
        for hb in job.heartbeats:
            hb.train_batch_end()
    assert job.stores[1].calls == before
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})  # rank 1 computes forever: rank 0's event
    picture, _ = job.polls_until_hang()  # Job.poll asserts that rank 1 returns no picture
    assert picture is not None and picture.busy == [1]


def test_a_notice_that_changes_during_the_silence_needs_one_more_agreeing_poll() -> None:
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    job.frozen.add(1)
    for _ in range(int(WAIT / POLL) + 2):  # notices posted, the ping out
        assert job.poll() is None
    job.where[2] = [BlockedIn("gloo", "2", 14)]  # rank 2's notice changes meanwhile (another group: rank 0 still waits)
    picture, polls = job.polls_until_hang()
    silence = job.detectors[0].silence_seconds
    assert picture is not None and picture.unanswered == (1,)
    assert polls == (int(silence / POLL) - 1) + 1  # the silence's remaining polls, then one confirming poll


def test_a_silent_rank_whose_watchdog_answers_vetoes() -> None:
    """Rank 1 posts nothing (its main thread is in a phase that explains a long wait), yet its
    watchdog runs and answers every ping: never a hang, however long the others wait."""
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    job.heartbeats[1].beat(Phase.validation)
    picture, _ = job.polls_until_hang(limit=40)
    assert picture is None
    assert job.detectors[1].board.answered_ping >= 2  # pinged again after each silence, answered each time


def test_a_frozen_rank_that_runs_again_answers_and_no_hang_follows() -> None:
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    job.heartbeats[1].beat(Phase.validation)
    job.frozen.add(1)
    for _ in range(int(WAIT / POLL) + 2):  # the ping is out, not yet answered
        assert job.poll() is None
    job.frozen.discard(1)  # its watchdog runs again before the silence ends: it answers
    picture, _ = job.polls_until_hang(limit=20)
    assert picture is None


def test_without_doorbells_every_rank_answers_pings_at_its_polls() -> None:
    job = Job()
    for detector in job.detectors:
        detector.board.rings_doorbells = False
    job.rang = lambda rank: True  # no doorbell: each poll looks for a ping
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    job.heartbeats[1].beat(Phase.validation)
    picture, _ = job.polls_until_hang(limit=30)
    assert picture is None
    job.frozen.add(1)
    picture, _ = job.polls_until_hang(limit=30)
    assert picture is not None and picture.unanswered == (1,)


def test_a_planted_answer_only_hides_a_silent_rank() -> None:
    """Another store client's answer value makes rank 0 take the silent rank for alive (a veto,
    as before pings existed); it never invents a silent rank."""
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    job.frozen.add(1)
    job.shared.set("cs/answer/1", "999999")
    picture, _ = job.polls_until_hang(limit=30)
    assert picture is None


def test_quorum_counts_the_blocked_ranks() -> None:
    notices = {r: OverrunNotice(rank=r, beat=9, step=5, blocked=(IN_ALLREDUCE,) if r < 3 else (), waited_seconds=4.0)
               for r in range(8)}
    picture = Picture(8, notices)
    assert picture.is_hang(0.375) and not picture.is_hang(0.5)
    assert not Picture(9, notices).is_hang(0.1)  # rank 8 never posted
    everyone = {r: OverrunNotice(rank=r, beat=9, step=5, blocked=(IN_ALLREDUCE,), waited_seconds=4.0) for r in range(8)}
    assert Picture(8, everyone).is_hang(1.0)  # all in one collective that never completes


def test_steady_state_costs_rank_zero_one_small_read_per_poll_and_the_others_nothing() -> None:
    job = Job()
    job.steps(5)
    before = [s.calls for s in job.stores]
    for _ in range(10):  # steps of 1 s, two polls each
        job.start_step()
        job.poll()
        job.poll()
        for hb in job.heartbeats:
            hb.train_batch_end()
    assert [s.calls - b for s, b in zip(job.stores, before)] == [20, 0, 0]


def test_a_notice_is_posted_once_and_reposted_only_when_it_changes() -> None:
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    job.detectors[0].tick = lambda pinged=False: None  # rank 0 does not decide: only the posts are counted
    for _ in range(int(WAIT / POLL) + 6):
        job.poll()
    assert job.counters()[1] == 2  # ranks 1 and 2 posted once each
    job.where[1] = [BlockedIn("gloo", "0", 40)]
    job.poll()
    assert job.counters()[1] == 3
    assert job.counters()[0] == 2


def test_stop_removes_this_ranks_key_and_its_notice() -> None:
    job = Job()
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE]})
    for _ in range(int(WAIT / POLL) + 2):
        job.poll()
    assert job.counters()[0] == 3
    for detector in job.detectors:
        detector.stop()
    assert not any(job.shared.check([notice_key(r)]) for r in range(3))
    assert job.counters()[0] == 0


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", b'{"rank": "x"}', b'{"rank": 1, "beat": 2, "step": 3}',
                                 b'{"rank": 1, "beat": 2, "step": 3, "blocked": [["gloo"]], "waited": 1}',
                                 b'{"rank": 1, "beat": 2, "step": 3, "blocked": 5, "waited": 1}',
                                 b'{"rank": 1, "beat": 2, "step": 3, "blocked": [], "p2p": [["gloo", "0"]], "waited": 1}',
                                 b"{" + b" " * 70000 + b"}"])
def test_a_malformed_notice_counts_as_none(raw: bytes) -> None:
    assert OverrunNotice.from_json(raw) is None


def test_a_notice_round_trips_and_one_with_a_number_out_of_range_is_refused() -> None:
    """A notice is another process's bytes: NaN, 1e999 (an OverflowError from ``int`` once
    switched consensus off for the rest of the run), floats for ints, lists where objects belong."""
    notice = OverrunNotice(rank=4, beat=17, step=12, blocked=(IN_ALLREDUCE, BlockedIn("nccl2", "0", 99)),
                           waited_seconds=3.25, working=True, p2p=(P2PWait("gloo", "2", 7, "recv", 3),))
    assert OverrunNotice.from_json(notice.to_json()) == notice
    text = notice.to_json()
    for hostile in (text.replace('"waited": 3.25', '"waited": NaN'), text.replace('"beat": 17', '"beat": 1e999'),
                    text.replace('"rank": 4', '"rank": 4.5'), text.replace(', 99]', ', 1e999]'),
                    text.replace('"blocked": [', '"blocked": {"x": ['), "[" + text + "]", "{" * 5000):
        assert OverrunNotice.from_json(hostile) is None, hostile[:80]
    assert OverrunNotice.from_json(text, world_size=4) is None  # rank 4 of a 4-rank job


@pytest.mark.parametrize("planted", [b"not a number", b"NaN", b"\xff\xfe" * 3000, b"=99:x\n++", b"=5:7\n" + b"+" * 5000])
def test_a_change_log_another_client_planted_costs_no_request_and_no_picture(planted: bytes) -> None:
    """Whatever another client wrote under the change log: every post and withdrawal still works
    (appends, never ``add``), the counts stay hints (a picture comes from the notices alone), a
    long log is folded into its header with the notices recounted, and the hang is still found."""
    job = Job()
    job.shared.set(CHANGES_KEY, planted)
    job.steps(5)
    job.start_step()
    job.where.update({0: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    picture, _ = job.polls_until_hang()
    assert picture is not None and sorted(picture.blocked) == [0, 2] and picture.busy == [1]
    posted, changes = job.counters()
    assert posted >= 3 and changes >= 3
    assert len(job.shared.read(CHANGES_KEY)) <= 40 + 3 * 8  # folded (when long), then a few appends


def test_the_change_log_is_folded_and_keeps_counting() -> None:
    """Posts and withdrawals over a long run: the log stays short, ``changes`` never goes back and
    ``posted`` matches the notices."""
    job = Job()
    board = job.detectors[1].board
    seen = []
    for i in range(3000):
        board.post(OverrunNotice(rank=1, beat=i, step=i, blocked=(IN_ALLREDUCE,), waited_seconds=3.0))
        board.withdraw()
        if i % 97 == 0:
            seen.append(job.counters())
    seen.append(job.counters())
    changes = [c for _, c in seen]
    assert changes == sorted(changes) and changes[-1] == 6000
    assert len(job.shared.read(CHANGES_KEY)) <= 4096 + 64
    board.post(OverrunNotice(rank=1, beat=1, step=1, blocked=(IN_ALLREDUCE,), waited_seconds=3.0))
    assert job.counters() == (1, 6001)


def test_a_planted_change_log_costs_no_connection_on_a_real_tcp_store() -> None:
    """On a real TCPStore an ``add`` on a value that is no integer fails the request; posting
    appends, so the rank's client keeps working."""
    import datetime
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    client = StoreClient(dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=datetime.timedelta(seconds=10)))
    try:
        server.set("cs/changes", "NaN")
        assert server.get("cs/changes") == b"NaN"  # applied before the client's requests (another connection)
        board = ConsensusBoard(client, 1, 2)
        board.start()
        board.post(OverrunNotice(rank=1, beat=1, step=1, blocked=(IN_ALLREDUCE,), waited_seconds=3.0))
        board.withdraw()
        assert client.read("cs/changes") == b"NaN+-"
        assert ConsensusBoard(client, 0, 2).counters() == (0, 5)
    finally:
        client.close()
        del server


def test_a_notice_under_another_ranks_key_is_ignored() -> None:
    job = Job()
    job.shared.set(notice_key(2), OverrunNotice(rank=1, beat=1, step=1, blocked=(), waited_seconds=1.0).to_json())
    assert job.detectors[0].board.read_all() == {}


def test_pg_status_gives_the_unfinished_op_of_each_group() -> None:
    status = {"0": {"last_enqueued_collective": "41", "last_completed_collective": "41", "last_started_collective": "-1"},
              "1": {"last_enqueued_collective": "13", "last_completed_collective": "12", "last_started_collective": "-1"}}
    assert blocked_from_status("gloo", status, None) == [BlockedIn("gloo", "1", 13)]


def test_an_unknown_completed_counter_is_decided_by_the_active_entries() -> None:
    status = {"0": {"last_enqueued_collective": 21, "last_started_collective": -1, "last_completed_collective": -1},
              "3": {"last_enqueued_collective": 8, "last_started_collective": -1, "last_completed_collective": -1}}
    entries = [{"pg_id": 0, "op_id": 21, "state": "scheduled"}, {"pg_id": 0, "op_id": 20, "state": "completed"}]
    assert blocked_from_status("nccl", status, entries) == [BlockedIn("nccl", "0", 21)]


@pytest.mark.parametrize("status", [None, [], {"0": "x"}, {"0": {"last_enqueued_collective": "abc"}},
                                    {"0": {"last_enqueued_collective": -1, "last_completed_collective": -1}}])
def test_a_malformed_pg_status_means_not_blocked(status: Any) -> None:
    assert blocked_from_status("gloo", status, [{"pg_id": 0, "op_id": "?"}]) == []


@pytest.mark.parametrize(("values", "message"), [
    ({"multiplier": 1.0}, r"ncclx.watchdog.consensus.multiplier=1.0 is not valid"),
    ({"quorum": 0.0}, r"ncclx.watchdog.consensus.quorum=0.0 is not valid"),
    ({"quorum": 1.5}, r"ncclx.watchdog.consensus.quorum=1.5 is not valid"),
    ({"min_wait_seconds": float("inf")}, r"ncclx.watchdog.consensus.min_wait_seconds=inf is not valid"),
    ({"warmup_steps": -1}, r"ncclx.watchdog.consensus.warmup_steps=-1 is not valid"),
])
def test_bad_consensus_settings_name_the_key(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        NcclxConfig(watchdog={"consensus": values})


def test_consensus_off_posts_nothing() -> None:
    job = Job(enabled=False)
    job.steps(20)
    assert job.heartbeats[0].consensus_wait() is None


def test_an_op_left_unfinished_before_the_watchdog_started_is_not_a_wait() -> None:
    """The recorder keeps the status of an earlier Trainer's destroyed group in this process: its
    unfinished op must not make ranks that only wait (every rank in its data loader, say) look
    blocked in a collective, which would let the consensus declare a hang."""
    leftover = BlockedIn("gloo", "0", 7)
    job = Job()
    job.where.update({r: [leftover] for r in range(3)})
    for detector in job.detectors:
        detector.start()  # a new watchdog in the same process: the leftover is there at start
    job.steps(5)
    job.start_step()
    picture, _ = job.polls_until_hang(limit=20)
    assert picture is None  # every rank waits outside collectives: left to the step threshold
    notices = job.detectors[0].board.read_all()
    assert notices is not None and sorted(notices) == [0, 1, 2]
    assert all(notice.blocked == () for notice in notices.values())
    job.where.update({0: [leftover, IN_ALLREDUCE], 2: [leftover, IN_ALLREDUCE]})  # this run's waits count
    picture, _ = job.polls_until_hang(limit=20)
    assert picture is not None and sorted(picture.blocked) == [0, 2]


def _recv(group: str, op_id: int, src: int, peer: int) -> P2PInFlight:
    return P2PInFlight(group, op_id, "recv", src, 1, peer)


def test_ranks_waiting_in_a_recv_count_as_blocked() -> None:
    """A pipeline: rank 0 never sends; rank 1 waits in a recv from it, rank 2 in a recv from rank 1.
    gloo records no send or recv, so only the point-to-point probe shows the waits."""
    job = Job()
    job.steps(5)
    job.start_step()
    job.p2p.update({1: [_recv("0", 31, 0, 0)], 2: [_recv("0", 30, 0, 1)]})
    picture, _ = job.polls_until_hang()
    assert picture is not None and sorted(picture.blocked) == [1, 2] and picture.busy == [0]
    assert "rank(s) 1 blocked in recv from rank 0 (gloo group 0)" in picture.describe()
    assert "rank(s) 2 blocked in recv from rank 1 (gloo group 0)" in picture.describe()
    assert job.detectors[1].board.posted.p2p == (P2PWait("gloo", "0", 31, "recv", 0),)


@pytest.mark.parametrize(("site", "polls"), [
    ("Callback.on_train_batch_end of Uploader at train.py:88 in upload", int(12.0 / POLL) + 2),
    ("train.py:40 in training_step", int(WAIT / POLL) + 2),  # anywhere else: the usual wait
])
def test_a_wait_that_recovered_at_a_site_is_not_posted_there_until_twice_as_long(site: str, polls: int) -> None:
    """Rank 0 uploads in a batch-end hook while the others wait in a barrier. An earlier upload
    was taken for a hang and recovered after 6 s: at that site rank 0 posts nothing for 12 s;
    elsewhere its wait is the usual 3 s (one poll to post, one to confirm)."""
    upload = "Callback.on_train_batch_end of Uploader at train.py:88 in upload"
    job = Job()
    job.site[0] = upload
    job.detectors[0].learn_recovery(job.detectors[0].site_now(), 6.0)
    assert job.detectors[0].learned_wait(upload) == RECOVERY_WAIT_FACTOR * 6.0 == 12.0
    job.steps(5)
    job.start_step()
    job.site[0] = site
    job.where.update({1: [IN_ALLREDUCE], 2: [IN_ALLREDUCE]})
    picture, seen = job.polls_until_hang(limit=40)
    assert picture is not None and picture.busy == [0] and seen == polls


def test_a_recovery_raises_the_learnt_wait_only_and_needs_a_site() -> None:
    job = Job()
    detector = job.detectors[1]
    detector.learn_recovery("hook at a.py:1 in f", 8.0)
    detector.learn_recovery("hook at a.py:1 in f", 3.0)  # a shorter recovery never lowers it
    assert detector.learned_wait("hook at a.py:1 in f") == 16.0
    for site, lasted in ((None, 8.0), ("", 8.0), ("b.py:2 in g", float("nan")), ("b.py:2 in g", -1.0),
                         ("b.py:2 in g", "x")):
        detector.learn_recovery(site, lasted)  # type: ignore[arg-type]
    assert detector.learned_wait("b.py:2 in g") is None and detector.learned_wait(None) is None


def test_a_site_that_cannot_be_read_is_none_and_learns_nothing() -> None:
    job = Job()

    def unreadable() -> str:
        raise RuntimeError("no stack")

    job.detectors[2]._main_thread_site = unreadable
    assert job.detectors[2].site_now() is None
