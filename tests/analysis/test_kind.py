"""Hang kind, advice and restart decision from small synthetic dumps (cases CPU gloo cannot make),
and the exit status per kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synth import collectives, dump, write

from lightning_ncclx.analysis import analyze_folder
from lightning_ncclx.analysis.kind import HangKind, RestartAction, classify
from lightning_ncclx.config import HANG_KINDS, WatchdogConfig, exit_code_for
from lightning_ncclx.errors import ConfigError

GROUPS = {"0": ("default_pg", [0, 1, 2])}


def _context(folder: Path, rank: int, host: str, phase: str = "train_step") -> None:
    (folder / f"rank_{rank:05d}.context.json").write_text(
        json.dumps({"rank": rank, "host": host, "world_size": 3, "phase": phase}))


def test_every_rank_in_the_same_unfinished_collective_is_collective_stalled(tmp_path):
    for r in range(3):
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(8, last_state="started"), GROUPS))
        _context(tmp_path, r, f"gpu-{r}")
    c = classify(analyze_folder(tmp_path))
    assert c.kind is HangKind.collective_stalled and c.restart is RestartAction.restart
    assert any("ncclras" in a for a in c.advice) and any("xid" in a for a in c.advice)
    assert "gpu-0, gpu-1, gpu-2" in " ".join(c.advice)


def test_a_lost_rank_on_a_known_host_advises_restarting_without_it(tmp_path):
    for r in (0, 1):
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(8, last_state="started"), GROUPS))
        _context(tmp_path, r, "gpu-1")
    _context(tmp_path, 2, "gpu-17")  # its context made it; its trace did not
    (tmp_path / "collection.json").write_text(json.dumps({"gone_ranks": [2], "missing_ranks": [2]}))
    d = analyze_folder(tmp_path).to_dict()
    assert d["hang_kind"] == "rank_lost"
    assert d["restart_advice"] == {"action": "restart_excluding_hosts", "reason": d["restart_advice"]["reason"],
                                   "hosts_to_exclude": ["gpu-17"]}
    assert d["hosts_to_exclude"] == ["gpu-17"]


def test_a_lost_rank_on_the_only_host_is_never_excluded(tmp_path):
    for r in (0, 1):
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(8, last_state="started"), GROUPS))
        _context(tmp_path, r, "gpu-1")
    _context(tmp_path, 2, "gpu-1")
    (tmp_path / "collection.json").write_text(json.dumps({"gone_ranks": [2], "missing_ranks": [2]}))
    c = classify(analyze_folder(tmp_path))
    assert c.kind is HangKind.rank_lost and c.restart is RestartAction.restart and c.hosts_to_exclude == ()


def test_missing_dump_without_collection_info_is_unknown_and_says_what_is_missing(tmp_path):
    for r in (0, 1):
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(8, last_state="started"), GROUPS))
    c = classify(analyze_folder(tmp_path))
    assert c.kind is HangKind.unknown and "rank(s) 2 left no dump" in c.reason


def test_a_hang_after_training_ended_is_teardown(tmp_path):
    for r in range(3):
        n = 7 if r == 2 else 8
        es = collectives(n, last_state="completed" if r == 2 else "started")
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(es, GROUPS))
        _context(tmp_path, r, "gpu-0", phase="idle")
    c = classify(analyze_folder(tmp_path))
    assert c.kind is HangKind.teardown and c.restart is RestartAction.do_not_restart


def test_a_dtype_mismatch_is_an_argument_mismatch_not_to_restart(tmp_path):
    for r in range(3):
        es = collectives(5, last_state="started", dtype="Half" if r == 1 else "Float")
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(es, GROUPS))
    d = analyze_folder(tmp_path).to_dict()
    assert d["hang_kind"] == "argument_mismatch" and "dtype" in d["hang_kind_reason"]
    assert d["restart_advice"]["action"] == "do_not_restart"


def test_no_dump_at_all_is_unknown(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing")
    assert classify(analyze_folder(tmp_path)).kind is HangKind.unknown


def test_exit_status_per_kind_defaults_and_overrides():
    config = WatchdogConfig()
    assert exit_code_for(HangKind.program_divergence, config) == 76
    assert exit_code_for("argument_mismatch", config) == 76
    assert exit_code_for("rank_lost", config) == 75 == exit_code_for(None, config)
    assert exit_code_for("no_hang", config) == config.exit_code
    custom = WatchdogConfig(exit_code=70, exit_codes={"rank_lost": 42})
    assert exit_code_for("rank_lost", custom) == 42 and exit_code_for("program_divergence", custom) == 70


def test_exit_codes_are_checked():
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.exit_codes.rank_gone=1 is not valid: unknown hang kind"):
        WatchdogConfig(exit_codes={"rank_gone": 1})
    with pytest.raises(ConfigError, match=r"ncclx.watchdog.exit_codes.rank_lost=300 is not valid"):
        WatchdogConfig(exit_codes={"rank_lost": 300})


def test_config_knows_every_kind():
    assert set(HANG_KINDS) == {k.value for k in HangKind}


def test_a_rank_that_raised_is_lost_and_a_program_exception_is_not_restarted(tmp_path):
    for r in range(3):
        es = collectives(7, last_state="completed") if r == 1 else collectives(8, last_state="started")
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(es, GROUPS))
        (tmp_path / f"rank_{r:05d}.context.json").write_text(json.dumps(
            {"rank": r, "host": "gpu-0", "world_size": 3, "phase": "idle" if r == 1 else "train_step",
             "exception": "KeyError: 'labels'" if r == 1 else None}))
    c = classify(analyze_folder(tmp_path))
    assert c.kind is HangKind.rank_lost and "rank 1 raised an exception" in c.reason
    assert c.restart is RestartAction.do_not_restart
    (tmp_path / "rank_00001.context.json").write_text(json.dumps(
        {"rank": 1, "host": "gpu-0", "world_size": 3, "exception": "RuntimeError: CUDA error: an illegal memory access"}))
    assert classify(analyze_folder(tmp_path)).restart is RestartAction.restart


def test_an_exception_where_no_rank_waits_is_that_exception_not_the_end_of_training(tmp_path):
    """A one-rank fit whose training_step raised: its phase reads idle (the exception is being
    handled) and its collectives all completed; the verdict names the exception, not teardown."""
    write(tmp_path, "rank_00000.nccl.fr.pkl", dump(collectives(8, last_state="completed"), {"0": ("default_pg", [0])}))
    (tmp_path / "rank_00000.context.json").write_text(json.dumps(
        {"rank": 0, "host": "gpu-0", "world_size": 1, "phase": "idle", "event": "exception-rank0-001",
         "reason": "exception", "exception": "RuntimeError: boom"}))
    c = classify(analyze_folder(tmp_path))
    assert c.kind is HangKind.no_hang and "rank 0 on gpu-0 raised an exception (RuntimeError: boom)" in c.reason
    assert c.restart is RestartAction.do_not_restart


def test_an_on_demand_dump_of_ranks_inside_one_collective_is_no_hang(tmp_path):
    for r in range(3):
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(8, last_state="started"), GROUPS))
        (tmp_path / f"rank_{r:05d}.context.json").write_text(json.dumps(
            {"rank": r, "host": "gpu-0", "world_size": 3, "event": "ondemand-001", "reason": "on_demand"}))
    assert classify(analyze_folder(tmp_path)).kind is HangKind.no_hang


def test_classification_never_raises_on_odd_evidence(tmp_path):
    from dataclasses import replace

    for r in range(3):
        write(tmp_path, f"rank_{r:05d}.nccl.fr.pkl", dump(collectives(8 if r else 7, last_state="started"), GROUPS))
    summary = analyze_folder(tmp_path)
    odd = replace(summary, context={"exceptions": {"x": "KeyError", "1": None}})
    assert classify(odd).kind is HangKind.program_divergence  # bad keys and empty texts are ignored
    broken = replace(summary, findings=(object(),))
    c = classify(broken)
    assert c.kind is HangKind.unknown and "could not be classified (AttributeError" in c.reason
