"""The verdict agrees with the analyzer's own findings on every folder of dumps the tests hold:
``culprit_ranks`` and the summary's group, op and waiting ranks are the head finding's; no rank
is both culprit and waiting; the hang kind's reason names the culprits; no culprit is a rank a
lower finding shows waiting (a ``consequence:`` line, or a recv whose sender is not a culprit);
the text report's HANG line names the same ranks."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from gloo_jobs import SCENARIOS
from synth import p2p_folder

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.model import Summary, Verdict
from lightning_ncclx.report.text import render_text

DATA = Path(__file__).resolve().parents[1] / "data"
DATA_FOLDERS = sorted([*DATA.glob("torch-2.13-gloo/*/ours"), *DATA.glob("torch-2.13-gloo/*/torch"),
                       DATA / "nccl-h200", *DATA.glob("nccl-h200/*.pkl"), *DATA.glob("nccl-h200/*.json")])
_NAMED = re.compile(r"rank(?:\(s\))? (\d+(?:, \d+)*)")


def disagreements(s: Summary) -> list[str]:
    """What in ``s`` contradicts its own findings (empty when everything agrees)."""
    if not s.findings:
        return [f"culprits {s.culprit_ranks} without a finding"] if s.culprit_ranks else []
    head, culprits, out = s.findings[0], set(s.culprit_ranks), []
    if s.culprit_ranks != head.ranks:
        out.append(f"culprit_ranks {s.culprit_ranks}, head finding {head.ranks}")
    if (s.process_group, s.op, s.collective_seq_id, s.waiting_ranks) != (head.group, head.op, head.seq,
                                                                         head.waiting_ranks):
        out.append("the summary's group, op, seq or waiting ranks are not the head finding's")
    if culprits & set(s.waiting_ranks):
        out.append(f"rank(s) {sorted(culprits & set(s.waiting_ranks))} both culprit and waiting")
    named = _NAMED.search(s.classification.reason)
    if named and {int(r) for r in named.group(1).split(", ")} != culprits:
        out.append(f"the kind's reason names rank(s) {named.group(1)}, the culprits are {sorted(culprits)}")
    for f in s.findings[1:]:
        for line in f.evidence:
            if line.startswith("consequence: rank ") and int(line.split()[2]) in culprits:
                out.append(f"culprit {line.split()[2]} is a consequence in a lower finding: {line}")
        waiter = f.waiting_ranks[0] if f.op == "recv" and len(f.waiting_ranks) == 1 else None
        if f.kind is Verdict.NOT_ENTERED and waiter in culprits and culprits.isdisjoint(f.ranks):
            out.append(f"culprit {waiter} waits in a recv from rank(s) {f.ranks}, not culprits")
    hang = next((line for line in render_text(s).splitlines() if line.startswith("HANG: ")), "")
    if "culprit rank(s)" in hang and not hang.endswith(f"culprit rank(s) {', '.join(map(str, s.culprit_ranks))}"):
        out.append(f"the text report says {hang!r}")
    return out


def test_the_check_finds_a_waiter_named_as_the_culprit(tmp_path):
    # pipeline 0 -> 1 -> 2, rank 1 skipped a send: the all_reduce's finding names rank 2, which waits on rank 1
    s = analyze_folder(p2p_folder(tmp_path, 3, (0, 1), {2: [("recv", 1, 2)]}))
    assert disagreements(s) == []
    waiter = next(f for f in s.findings if f.ranks == (2,))
    recv = next(f for f in s.findings if f.op == "recv")
    blamed = replace(s, findings=(waiter, recv), culprit_ranks=(2,), process_group=waiter.group, op=waiter.op,
                     collective_seq_id=waiter.seq, waiting_ranks=waiter.waiting_ranks)
    assert disagreements(blamed) == [
        "the kind's reason names rank(s) 1, the culprits are [2]",
        "culprit 2 waits in a recv from rank(s) (1,), not culprits"]
    assert disagreements(replace(s, culprit_ranks=(1, 2)))[0] == "culprit_ranks (1, 2), head finding (1,)"


@pytest.mark.parametrize("folder", DATA_FOLDERS, ids=lambda p: str(p.relative_to(DATA)))
def test_the_verdict_agrees_with_the_findings_on_the_stored_dumps(folder: Path) -> None:
    s = analyze_folder(folder)
    assert disagreements(s) == [], [f.message for f in s.findings]


def test_the_verdict_agrees_with_the_findings_on_every_gloo_scenario(gloo_dumps) -> None:
    found = {}
    for scenario in SCENARIOS:
        for layout in ("ours", "torch", "fixed"):
            s = analyze_folder(gloo_dumps[scenario] / layout)
            if disagreements(s):
                found[f"{scenario}/{layout}"] = (disagreements(s), [f.message for f in s.findings])
    assert found == {}
    for scenario in ("pipe_skip", "pipe_wrong"):  # stage 1 broke the pipeline; stages 0 and 2 wait on it
        s = analyze_folder(gloo_dumps[scenario] / "ours")
        assert s.culprit_ranks == (1,) and {w.rank for w in s.findings[0].waits} == {0, 2}, scenario
        assert s.classification.kind.value == "program_divergence"
