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
