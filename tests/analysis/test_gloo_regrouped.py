"""Real gloo dumps (gloo_worker.py), renamed and regrouped the way users gather them: the same
verdict and culprits as the original folder, whatever the names, folders and formats."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from lightning_ncclx.analysis import analyze_folder

SCENARIOS = ("healthy", "skip", "op", "size", "outside", "subgroup", "order", "uneven_skip", "wrap", "extra")


def _traces(original: Path) -> dict[int, dict]:
    """rank -> the decoded dump in the plugin's layout (the test job's own output: trusted)."""
    return {int(p.name[5:10]): pickle.loads(p.read_bytes()) for p in sorted(original.glob("rank_*.gloo.fr.pkl"))}


def _as_json(data: dict) -> str:
    entries = [{k: v for k, v in e.items() if k != "frames"} for e in data["entries"]]  # JSON dumps carry none
    return json.dumps(dict(data, entries=entries))


def _flat(traces: dict[int, dict], out: Path) -> None:
    for rank, data in traces.items():
        (out / f"rank_{rank}.pkl").write_bytes(pickle.dumps(data))


def _per_node(traces: dict[int, dict], out: Path) -> None:
    for rank, data in traces.items():
        node = out / f"node-{'ab'[rank % 2]}"
        if rank == 0:
            (node / "rank_0").mkdir(parents=True)
            (node / "rank_0" / "fr.pkl").write_bytes(pickle.dumps(data))  # rank from the folder
        else:
            node.mkdir(parents=True, exist_ok=True)
            (node / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(data))


def _mixed_with_a_duplicate(traces: dict[int, dict], out: Path) -> None:
    for rank, data in traces.items():
        if rank % 2:
            (out / f"rank{rank}.json").write_text(_as_json(data))
        else:
            (out / f"trace-rank-{rank}.pickle").write_bytes(pickle.dumps(data))
    older = dict(traces[1], entries=traces[1]["entries"][:-1])
    (out / "old").mkdir()
    (out / "old" / "rank_1.pkl").write_bytes(pickle.dumps(older))


LAYOUTS = {"flat": _flat, "per_node": _per_node, "mixed": _mixed_with_a_duplicate}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_renamed_and_regrouped_real_dumps_give_the_same_verdict(gloo_dumps, tmp_path, scenario, layout):
    original = gloo_dumps[scenario] / "ours"
    traces = _traces(original)
    assert len(traces) == 3
    LAYOUTS[layout](traces, tmp_path)
    want, got = analyze_folder(original), analyze_folder(tmp_path)
    assert (got.verdict, got.culprit_ranks, got.waiting_ranks, got.collective_seq_id) == (
        want.verdict, want.culprit_ranks, want.waiting_ranks, want.collective_seq_id), got.headline
    assert got.ranks_seen == (0, 1, 2) and got.unreadable == ()
    if layout == "mixed":
        (dup,) = got.duplicates
        assert dup.rank == 1 and dup.dropped.endswith("old/rank_1.pkl")


def test_torchs_own_file_names_regrouped_into_host_folders(gloo_dumps, tmp_path):
    original = gloo_dumps["skip"] / "torch"
    for f in original.iterdir():
        host = tmp_path / "gathered" / f"host{int(f.name.rsplit('_', 1)[1]) // 2}"
        host.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, host / f.name)
    want, got = analyze_folder(original), analyze_folder(tmp_path)
    assert (got.verdict, got.culprit_ranks) == (want.verdict, want.culprit_ranks) and got.culprit_ranks == (2,)
