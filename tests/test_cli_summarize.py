"""``lightning-ncclx summarize``: exit codes 0/1/2, formats, and no traceback on bad input."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "analysis"))
from synth import collectives, dump, write  # noqa: E402

from lightning_ncclx.cli import main  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "nccl-h200"


class _Evil:
    def __reduce__(self):
        return (exec, ("open('/tmp/_ncclx_pwned', 'w').write('x')",))


def _hang(folder: Path) -> Path:
    groups = {"0": ("default_pg", [0, 1])}
    write(folder, "nccl_trace_rank_0", dump(collectives(5, last_state="started"), groups))
    write(folder, "nccl_trace_rank_1", dump(collectives(4), groups))
    return folder


def test_no_hang_exits_0(tmp_path, capsys):
    (tmp_path / "rank_0.pkl").write_bytes((DATA / "ws1_2000_entries.pkl").read_bytes())  # 2,000 finished ops
    assert main(["summarize", str(tmp_path)]) == 0
    assert "NO HANG FOUND" in capsys.readouterr().out


def test_torch_own_timeout_dump_points_below_the_program(capsys):
    """The H200's NCCL watchdog timeout: every rank (one) in an all_reduce torch counts unfinished.
    Without the watchdog's word that the job stalled it is not called a hang (exit 0), but its kind
    says where to look if it is one."""
    assert main(["summarize", str(DATA)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("KIND: collective_stalled - ") and "never completed" in out


def test_hang_exits_1_and_every_format_renders(tmp_path, capsys):
    folder = _hang(tmp_path / "d")
    assert main(["summarize", str(folder), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["culprit_ranks"] == [1]
    for fmt in ("text", "markdown", "html"):
        assert main(["summarize", str(folder), "--format", fmt, "--output", str(tmp_path / f"o.{fmt}")]) == 1
        assert (tmp_path / f"o.{fmt}").stat().st_size > 100


def test_bad_inputs_exit_2_with_a_message(tmp_path, capsys):
    assert main(["summarize", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["summarize", str(tmp_path / "empty")]) == 2
    assert "no readable flight-recorder dump" in capsys.readouterr().err


def test_malicious_pickle_is_refused_in_a_real_process_without_traceback(tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(_Evil()))
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"\x80\x04\x95trunc")
    proc = subprocess.run([sys.executable, "-m", "lightning_ncclx.cli", "summarize", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "refused to load builtins.exec" in proc.stderr and "Traceback" not in proc.stderr
    assert not Path("/tmp/_ncclx_pwned").exists()


def test_some_ranks_unreadable_still_analyzes_the_rest(tmp_path, capsys):
    folder = _hang(tmp_path)
    (folder / "nccl_trace_rank_2").write_bytes(b"random bytes")
    assert main(["summarize", str(folder), "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["unreadable"][0]["path"].endswith("nccl_trace_rank_2")
    assert "skipped" in captured.err


def _event(folder: Path, culprit: int, mtime: float) -> None:
    """One of the plugin's event folders: two NCCL traces and their context files."""
    import os

    groups = {"0": ("default_pg", [0, 1])}
    for rank in (0, 1):
        entries = collectives(5 if rank != culprit else 4, last_state="started" if rank != culprit else "completed")
        write(folder, f"rank_{rank:05d}.nccl.fr.pkl", dump(entries, groups))
        ctx = folder / f"rank_{rank:05d}.context.json"
        ctx.write_text(json.dumps({"rank": rank, "world_size": 2, "event": folder.name, "host": "h"}))
        os.utime(ctx, (mtime, mtime))
    (folder / "ranks" / "h").mkdir(parents=True)  # a gathered copy is part of its event, not one more


def test_a_run_folder_with_several_events_summarizes_the_newest_and_says_so(tmp_path, capsys):
    _event(tmp_path / "stall-001", culprit=1, mtime=1_000_000)
    _event(tmp_path / "stall-002", culprit=0, mtime=2_000_000)
    assert main(["summarize", str(tmp_path), "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["culprit_ranks"] == [0]
    assert "holds 2 dump events (stall-001, stall-002); summarizing the newest" in captured.err
    assert main(["summarize", str(tmp_path / "stall-001"), "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["culprit_ranks"] == [1] and "dump events" not in captured.err


def test_one_event_gathered_into_per_node_folders_is_summarized_whole(tmp_path, capsys):
    """Each node's ranks of stall-001 copied into a folder of their own (as users gather them), a
    second event beside it: the two node folders are one event, read together."""
    import shutil

    _event(tmp_path / "made" / "stall-001", culprit=1, mtime=1_000_000)
    gathered = tmp_path / "gathered"
    for rank in (0, 1):
        node = gathered / "stall-001" / f"node-{rank}"
        node.mkdir(parents=True)
        for name in (f"rank_{rank:05d}.nccl.fr.pkl", f"rank_{rank:05d}.context.json"):
            shutil.copy2(tmp_path / "made" / "stall-001" / name, node / name)
    (gathered / "stall-001" / "node-1" / "rank_00002.nccl.fr.pkl").write_bytes(b"\x00hostile")
    _event(gathered / "stall-000", culprit=0, mtime=500_000)
    assert main(["summarize", str(gathered), "--format", "json"]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["culprit_ranks"] == [1] and out["ranks_seen"] == [0, 1], out
    assert "holds 2 dump events (stall-000, stall-001); summarizing the newest" in captured.err
