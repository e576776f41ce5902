"""Dumps written by torch 2.13 (tests/data/torch-2.13-gloo) give the verdicts the same jobs get on
the installed torch, as written, renamed and regrouped the way users gather them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lightning_ncclx.analysis import Verdict, analyze_folder

DATA = Path(__file__).resolve().parents[1] / "data" / "torch-2.13-gloo"

EXPECTED = {  # scenario -> (verdict, culprits) for the plugin's layout; torch's raw layout differs only where said
    "healthy": (Verdict.NO_HANG, ()),
    "skip": (Verdict.NOT_ENTERED, (2,)),
    "op": (Verdict.OP_MISMATCH, (2,)),
    "size": (Verdict.SIZE_MISMATCH, (2,)),
    "outside": (Verdict.NOT_ENTERED, (2,)),
    "subgroup": (Verdict.NOT_ENTERED, (2,)),
    "order": (Verdict.NOT_ENTERED, (2,)),
    "extra": (Verdict.EXTRA_COLLECTIVE, (2,)),
}
RAW_DIFFERS = {"subgroup": (Verdict.NOT_ENTERED, (1, 2))}  # raw gloo pg_config: sub-group members unknown


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
@pytest.mark.parametrize("layout", ["ours", "torch"])
def test_torch_2_13_dumps_get_the_verdict_of_their_fault(scenario, layout):
    s = analyze_folder(DATA / scenario / layout)
    want = RAW_DIFFERS.get(scenario, EXPECTED[scenario]) if layout == "torch" else EXPECTED[scenario]
    assert (s.verdict, s.culprit_ranks) == want, s.headline
    assert {i.version for i in s.inputs} == {"2.10"} and len(s.inputs) == 3


@pytest.mark.parametrize("scenario", ["skip", "op", "extra"])
def test_torch_2_13_dumps_renamed_into_per_node_folders_keep_their_verdict(scenario, tmp_path):
    for raw in sorted((DATA / scenario / "torch").iterdir()):
        rank = int(raw.name.rsplit("_", 1)[1])
        node = tmp_path / f"node-{rank // 2}" / f"rank{rank}"
        node.mkdir(parents=True)
        shutil.copy(raw, node / "trace.pickle")  # the rank only in the folder name
    s = analyze_folder(tmp_path)
    assert (s.verdict, s.culprit_ranks) == EXPECTED[scenario], s.headline
