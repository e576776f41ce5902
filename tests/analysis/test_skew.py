from synth import T0, collectives, dump, write

from lightning_ncclx.analysis import analyze_folder


def test_the_late_rank_tops_the_straggler_report(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r in range(3):
        es = collectives(50)
        for i, e in enumerate(es):
            e["time_created_ns"] = T0 + i * 10_000_000 + (5_000_000 if r == 1 else 0) + r * 1000
        write(tmp_path, f"t{r}", dump(es, groups))
    s = analyze_folder(tmp_path)
    top = s.stragglers[0]
    assert top.rank == 1 and 4.9 < top.median_late_ms < 5.1 and top.last_fraction == 1.0 and top.samples == 50


def test_median_and_p95_lateness_are_the_nearest_rank_values_of_each_rank(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2])}
    for r in range(3):
        es = collectives(50)
        for i, e in enumerate(es):  # rank 1 is i ms late at the i-th collective
            e["time_created_ns"] = T0 + i * 100_000_000 + (i * 1_000_000 if r == 1 else 0) + r * 1000
        write(tmp_path, f"t{r}", dump(es, groups))
    top = analyze_folder(tmp_path).stragglers[0]
    # 50 values 0.001 .. 49.001 ms: the median is the 25th (index round(24.5) = 24), p95 index round(46.55) = 47
    assert top.rank == 1 and top.samples == 50
    assert abs(top.median_late_ms - 24.001) < 1e-9 and abs(top.p95_late_ms - 47.001) < 1e-9
    assert top.last_fraction == 0.98  # at the first collective rank 2 (2 µs) is later than rank 1 (1 µs)
