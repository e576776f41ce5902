"""Step records from hook readings on a fake clock, medians per interval, the compact form."""

from __future__ import annotations

from lightning_ncclx.straggler.timings import IntervalSummary, StepRecorder, summarize_records


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run_batch(recorder: StepRecorder, clock: FakeClock, fetch: float, forward: float, backward: float,
              optimizer: float) -> None:
    clock.advance(fetch)
    recorder.batch_start()
    clock.advance(forward)
    recorder.mark("before_backward")
    clock.advance(backward)
    recorder.mark("after_backward")
    recorder.mark("before_optimizer")
    clock.advance(optimizer)
    recorder.batch_end()


def test_parts_are_split_at_the_hook_points_and_medians_taken() -> None:
    clock = FakeClock()
    recorder = StepRecorder(clock=clock)
    for forward in (0.10, 0.50, 0.12):  # one slow batch: the median ignores it
        run_batch(recorder, clock, fetch=0.01, forward=forward, backward=0.03, optimizer=0.002)
    records = recorder.take()
    assert recorder.take() == []
    assert records[0].data_fetch is None  # the first batch follows no fetch that was seen
    s = summarize_records(records, rank=3, interval=7, host="h")
    assert (s.rank, s.interval, s.batches) == (3, 7, 3)
    assert abs(s.parts["forward"] - 0.12) < 1e-9 and abs(s.parts["data_fetch"] - 0.01) < 1e-9
    assert abs(s.parts["backward"] - 0.03) < 1e-9 and abs(s.parts["optimizer"] - 0.002) < 1e-9
    assert abs(s.work_seconds - 0.132) < 1e-9


def test_gap_after_validation_is_not_data_fetch() -> None:
    clock = FakeClock()
    recorder = StepRecorder(clock=clock)
    run_batch(recorder, clock, 0.0, 0.1, 0.0, 0.0)
    recorder.forget_fetch()
    run_batch(recorder, clock, 5.0, 0.1, 0.0, 0.0)
    assert [r.data_fetch for r in recorder.take()] == [None, None]


def test_manual_optimization_without_backward_hooks_counts_the_step_as_forward() -> None:
    clock = FakeClock()
    recorder = StepRecorder(clock=clock)
    recorder.batch_start()
    clock.advance(0.2)
    recorder.batch_end()
    parts = recorder.take()[0].seconds()
    assert list(parts) == ["forward"] and abs(parts["forward"] - 0.2) < 1e-9


def test_compact_form_round_trips() -> None:
    s = IntervalSummary(rank=1, interval=2, host="gpu-12", batches=100,
                        parts={"forward": 0.1234567, "data_fetch": 0.001})
    assert IntervalSummary.from_compact(s.to_compact()) == s
