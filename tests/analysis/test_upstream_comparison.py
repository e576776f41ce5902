"""Where torchfrtrace (torch.distributed.flight_recorder) is wrong on the same files, and lightning-ncclx is not."""

from __future__ import annotations

import logging

import pytest

from lightning_ncclx.analysis import Verdict, analyze_folder

fr_trace = pytest.importorskip("torch.distributed.flight_recorder.fr_trace")


def _torchfrtrace(folder, caplog) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        fr_trace.main([str(folder)])
    return caplog.text


def test_torchfrtrace_crashes_on_raw_gloo_dumps_we_read_them(gloo_dumps):
    with pytest.raises(KeyError):
        fr_trace.main([str(gloo_dumps["op"] / "torch")])
    assert analyze_folder(gloo_dumps["op"] / "torch").culprit_ranks == (2,)


def test_torchfrtrace_blames_the_wrong_ranks_for_an_op_mismatch(gloo_dumps, caplog):
    out = _torchfrtrace(gloo_dumps["op"] / "fixed", caplog)
    # it names culprits relative to whichever file it read first: here the odd rank 2's
    assert "Culprit rank 0" in out and "Culprit rank 1" in out and "Culprit rank 2" not in out
    s = analyze_folder(gloo_dumps["op"] / "fixed")
    assert s.verdict is Verdict.OP_MISMATCH and s.culprit_ranks == (2,)


def test_torchfrtrace_drops_a_rank_when_sub_groups_and_wrapped_buffers_meet(gloo_dumps, caplog):
    out = _torchfrtrace(gloo_dumps["wrap"] / "fixed", caplog)
    assert "missing ranks: {0}" in out  # rank 0 dumped; record_id alignment threw it away
    s = analyze_folder(gloo_dumps["wrap"] / "fixed")
    assert s.ranks_missing == () and s.culprit_ranks == (2,) and s.verdict is Verdict.OP_MISMATCH
