"""A rank aborted inside a collective whose arguments differ is the program's fault, not a lost
node: gloo aborts the process of the rank whose buffer is smaller than what the call sends it, and
its peers then lose their connection to it (synthetic gloo dumps; the real jobs are in
test_kind_aborts_jobs.py)."""

from __future__ import annotations

import json
from pathlib import Path

from synth import collectives, dump, entry, write

from lightning_ncclx.analysis import analyze_folder

GROUPS = {"0": ("default_pg", [0, 1, 2])}
RESET = ("RuntimeError: [gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:43716: Connection reset by peer. "
         "This is typically caused by a remote worker hanging or bugs")


def _rank(folder: Path, rank: int, entries: list, exception: str | None = None) -> None:
    write(folder, f"rank_{rank:05d}.gloo.fr.pkl", dump(entries, GROUPS))
    ctx = {"rank": rank, "world_size": 3, "host": f"node-{rank}", "event": "exception-rank2-001",
           "reason": "exception", "phase": "train_step", "trace_files": [f"rank_{rank:05d}.gloo.fr.pkl"],
           **({"exception": exception} if exception else {})}
    (folder / f"rank_{rank:05d}.context.json").write_text(json.dumps(ctx))


def _gone(folder: Path, rank: int) -> None:
    (folder / f"rank_{rank:05d}.context.json").write_text(json.dumps({"rank": rank, "host": f"node-{rank}"}))
    (folder / "collection.json").write_text(json.dumps({"gone_ranks": [rank], "missing_ranks": [rank]}))


def test_a_mismatch_whose_culprit_then_lost_its_peer_is_an_argument_mismatch(tmp_path):
    # rank 2 all_reduces doubles where the others use floats; gloo aborted rank 1, rank 2 raised
    _rank(tmp_path, 0, collectives(8, lib="gloo", last_state="scheduled"))
    doubles = collectives(7, lib="gloo") + [entry(7, 8, lib="gloo", dtype="Double", state="scheduled")]
    _rank(tmp_path, 2, doubles, exception=RESET)
    _gone(tmp_path, 1)
    d = analyze_folder(tmp_path).to_dict()
    assert d["culprit_ranks"] == [2] and d["verdict"] == "dtype_mismatch"
    assert (d["hang_kind"], d["restart_advice"]["action"]) == ("argument_mismatch", "do_not_restart"), d["hang_kind_reason"]
    assert d["advice"][-1].startswith("rank 2 then lost its connection to a peer (RuntimeError: ")
    assert "EnforceNotMet ... op.preamble.length <= op.nbytes" in d["advice"][-1]
    assert d["advice"][-1].endswith("; rank(s) 1 left no dump")


def test_a_mismatch_whose_aborted_peer_left_no_dump_before_any_rank_raised_says_why_it_is_gone(tmp_path):
    # caught before rank 2's read failed: no exception yet, rank 1 aborted by gloo (seen on its host)
    _rank(tmp_path, 0, collectives(8, lib="gloo", last_state="scheduled"))
    _rank(tmp_path, 2, collectives(7, lib="gloo") + [entry(7, 8, lib="gloo", dtype="Double", state="scheduled")])
    _gone(tmp_path, 1)
    collection = json.loads((tmp_path / "collection.json").read_text())
    collection["gone_exits"] = {"1": {"signal": "SIGABRT", "status": 134, "known_from": "rank 0 (same host)"}}
    (tmp_path / "collection.json").write_text(json.dumps(collection))
    d = analyze_folder(tmp_path).to_dict()
    assert d["culprit_ranks"] == [2] and d["verdict"] == "dtype_mismatch"
    assert (d["hang_kind"], d["restart_advice"]["action"]) == ("argument_mismatch", "do_not_restart")
    assert d["advice"][-1].startswith("rank(s) 1 left no dump (rank 1 ended with SIGABRT (status 134)): gloo aborts")
    assert "EnforceNotMet ... op.preamble.length <= op.nbytes" in d["advice"][-1]


def test_an_exception_of_the_program_on_a_mismatch_culprit_stays_its_own(tmp_path):
    _rank(tmp_path, 0, collectives(8, lib="gloo", last_state="scheduled"))
    doubles = collectives(7, lib="gloo") + [entry(7, 8, lib="gloo", dtype="Double", state="scheduled")]
    _rank(tmp_path, 2, doubles, exception="ValueError: bad batch")
    _gone(tmp_path, 1)
    d = analyze_folder(tmp_path).to_dict()
    assert (d["hang_kind"], d["restart_advice"]["action"]) == ("rank_lost", "do_not_restart")
    assert d["hang_kind_reason"].startswith("rank 2 raised an exception")


def test_a_gloo_rank_gone_while_the_others_wait_in_a_collective_is_not_restarted(tmp_path):
    # rank 2 left no dump and its process is gone; ranks 0 and 1 wait in the all_reduce: it may have
    # crashed, or gloo aborted it for a smaller buffer than its peers'. The dumps cannot tell.
    for rank in (0, 1):
        _rank(tmp_path, rank, collectives(8, lib="gloo", last_state="scheduled"))
    _gone(tmp_path, 2)
    d = analyze_folder(tmp_path).to_dict()
    assert d["hang_kind"] == "rank_lost" and d["culprit_ranks"] == [2]
    assert d["restart_advice"] == {"action": "do_not_restart", "reason": d["restart_advice"]["reason"],
                                   "hosts_to_exclude": []}
    assert "a restart fails the same way" in d["restart_advice"]["reason"]
    assert "the dumps cannot tell which" in d["hang_kind_reason"]
    assert d["advice"][0].startswith("the log of rank(s) 2: `EnforceNotMet ... op.preamble.length <= op.nbytes`")


def test_a_rank_gone_after_the_others_finished_their_collectives_is_restarted_without_its_host(tmp_path):
    for rank in (0, 1):
        _rank(tmp_path, rank, collectives(8, lib="gloo"))
    _gone(tmp_path, 2)
    d = analyze_folder(tmp_path).to_dict()
    assert d["hang_kind"] == "rank_lost"
    assert (d["restart_advice"]["action"], d["hosts_to_exclude"]) == ("restart_excluding_hosts", ["node-2"])


def test_a_gloo_rank_gone_whose_peers_lost_their_connection_to_it_is_not_restarted(tmp_path):
    # ranks 0 and 1 raised when rank 2 went, so their collective ended: the abort happened inside it
    for rank in (0, 1):
        _rank(tmp_path, rank, collectives(8, lib="gloo"), exception="RuntimeError: Connection closed by peer")
    _gone(tmp_path, 2)
    d = analyze_folder(tmp_path).to_dict()
    assert d["culprit_ranks"] == [2] and d["restart_advice"]["action"] == "do_not_restart", d["hang_kind_reason"]


def _gone_with(folder: Path, rank: int, exit_: dict) -> None:
    (folder / f"rank_{rank:05d}.context.json").write_text(json.dumps({"rank": rank, "host": f"node-{rank}"}))
    (folder / "collection.json").write_text(json.dumps({"gone_ranks": [rank], "missing_ranks": [rank],
                                                        "gone_exits": {str(rank): exit_}}))


ABORTED = {"signal": "SIGABRT", "status": 134, "found_gone_unix": 1.0,
           "known_from": "its wait status, read from /proc by rank 0 on the same host before its parent reaped it"}


def test_a_gloo_rank_aborted_while_the_others_wait_in_the_collective_is_an_argument_mismatch(tmp_path):
    # collection.json names how rank 2 ended: SIGABRT, which gloo raises for a smaller buffer than its peers'
    for rank in (0, 1):
        _rank(tmp_path, rank, collectives(8, lib="gloo", last_state="scheduled"))
    _gone_with(tmp_path, 2, ABORTED)
    d = analyze_folder(tmp_path).to_dict()
    assert d["culprit_ranks"] == [2]
    assert (d["hang_kind"], d["restart_advice"]["action"]) == ("argument_mismatch", "do_not_restart"), d["hang_kind_reason"]
    assert "was aborted with SIGABRT (status 134)" in d["hang_kind_reason"]
    assert d["context"]["rank_exits"]["2"]["signal"] == "SIGABRT"
    row = next(r for r in d["per_rank"] if r["rank"] == 2)
    assert "ended with SIGABRT (status 134)" in row["detail"], row
    assert any(a.startswith("how it ended is known from its wait status") for a in d["advice"]), d["advice"]


def test_an_exit_status_of_134_alone_is_an_abort_too(tmp_path):
    for rank in (0, 1):
        _rank(tmp_path, rank, collectives(8, lib="gloo"), exception="RuntimeError: Connection closed by peer")
    _gone_with(tmp_path, 2, {"signal": None, "status": 134, "known_from": "the launcher"})
    d = analyze_folder(tmp_path).to_dict()
    assert d["culprit_ranks"] == [2]
    assert (d["hang_kind"], d["restart_advice"]["action"]) == ("argument_mismatch", "do_not_restart"), d["hang_kind_reason"]


def test_a_peer_that_lost_its_connection_to_an_aborted_rank_is_never_restarted(tmp_path):
    # rank 0 raised when rank 2 went and is named first; the lost connection would read as transient
    _rank(tmp_path, 0, collectives(7, lib="gloo"), exception="RuntimeError: Connection closed by peer")
    _rank(tmp_path, 1, collectives(8, lib="gloo", last_state="scheduled"))
    _gone_with(tmp_path, 2, ABORTED)
    d = analyze_folder(tmp_path).to_dict()
    assert d["restart_advice"]["action"] == "do_not_restart", (d["hang_kind"], d["hang_kind_reason"])
    assert d["hang_kind"] == "argument_mismatch", d["hang_kind_reason"]


def test_a_rank_killed_by_another_signal_stays_a_lost_rank(tmp_path):
    # SIGKILL (the OOM killer, a node agent) says nothing about the collective's arguments
    for rank in (0, 1):
        _rank(tmp_path, rank, collectives(8, lib="gloo", last_state="scheduled"))
    _gone_with(tmp_path, 2, {"signal": "SIGKILL", "status": 137, "known_from": "the launcher"})
    d = analyze_folder(tmp_path).to_dict()
    assert d["hang_kind"] == "rank_lost" and "the dumps cannot tell which" in d["hang_kind_reason"]
    row = next(r for r in d["per_rank"] if r["rank"] == 2)
    assert "ended with SIGKILL (status 137)" in row["detail"]


def test_an_exit_record_that_does_not_check_is_read_as_unknown(tmp_path):
    for rank in (0, 1):
        _rank(tmp_path, rank, collectives(8, lib="gloo", last_state="scheduled"))
    _gone_with(tmp_path, 2, {"signal": "SIGABRT; rm -rf /", "status": 99999, "known_from": ["x"]})
    d = analyze_folder(tmp_path).to_dict()
    assert d["hang_kind"] == "rank_lost"
    assert d["context"]["rank_exits"]["2"] == {"signal": None, "status": None, "known_from": None, "peers_saw": {}}
