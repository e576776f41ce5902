"""reader_pool: a file built to load forever (a dict key that is a tuple sharing its parts, level
after level: hashing it walks 2**40 paths) is stopped at its deadline and named unreadable; every
other file is read, in one process or in several. Real ``summarize`` runs in a child process,
where forking is safe, as on a user's machine."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synth import collectives, dump, write

from lightning_ncclx.analysis.reader_pool import DEADLINE_S, deadline_s, fork_safe

REPO = Path(__file__).resolve().parents[2]


def _hash_bomb(depth: int = 40) -> bytes:
    """``{t40: 1}`` with ``t(i+1) = (t(i), t(i))``, written opcode by opcode: building it here would
    hash it."""
    out = bytearray(b"\x80\x02})")  # PROTO 2, EMPTY_DICT, EMPTY_TUPLE
    for i in range(depth):
        out += b"q" + bytes([i]) + b"h" + bytes([i]) + b"\x86"  # BINPUT i, BINGET i, TUPLE2
    return bytes(out + b"K\x01s.")  # BININT1 1, SETITEM, STOP


def test_the_bomb_is_what_it_says_at_a_depth_that_loads() -> None:
    key, value = next(iter(pickle.loads(_hash_bomb(depth=3)).items()))
    assert key == ((((), ()), ((), ())), (((), ()), ((), ()))) and value == 1 and key[0] is key[1]


def _folder(tmp_path: Path, healthy: int, bomb_at: int) -> Path:
    folder = tmp_path / "dumps"
    for rank in range(healthy + 1):
        if rank == bomb_at:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"rank_{rank}.nccl.fr.pkl").write_bytes(_hash_bomb())
        else:
            write(folder, f"rank_{rank}.nccl.fr.pkl", dump(collectives(20), {"0": ("default_pg", list(range(healthy + 1)))}))
    return folder


def _summarize(folder: Path, out: Path, deadline: float) -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from lightning_ncclx.analysis import reader_pool
        from lightning_ncclx.cli.summarize import run_summarize
        reader_pool.DEADLINE_S = {deadline!r}
        reader_pool.DEADLINE_S_PER_MIB = 0.0
        sys.exit(run_summarize(Path({str(folder)!r}), fmt="json", output=Path({str(out)!r})))
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, cwd=REPO)


def test_the_bomb_hangs_a_plain_unpickler_for_longer_than_its_deadline() -> None:
    """The case is real: one level less deep takes twice as long, so 40 levels would take hours."""
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], input=_hash_bomb(), timeout=3)


@pytest.mark.parametrize(("healthy", "bomb_at"), [(2, 1), (40, 17)], ids=["one-process", "several-processes"])
def test_a_file_that_loads_forever_is_stopped_and_named_and_the_others_are_read(tmp_path, healthy, bomb_at) -> None:
    folder = _folder(tmp_path, healthy, bomb_at)
    out = tmp_path / "summary.json"
    done = _summarize(folder, out, deadline=2.0)
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads(out.read_text())
    bomb = str(folder / f"rank_{bomb_at}.nccl.fr.pkl")
    assert [u["path"] for u in summary["unreadable"]] == [bomb]
    assert "ended after 2 s" in summary["unreadable"][0]["why"]
    assert f"skipped {bomb}: the process reading it was ended after 2 s" in done.stderr
    assert sorted(summary["ranks_seen"]) == [r for r in range(healthy + 1) if r != bomb_at]


def test_a_folder_of_honest_dumps_reads_the_same_in_a_pool_as_in_process(tmp_path) -> None:
    folder = _folder(tmp_path, 30, bomb_at=-1)
    pooled, alone = tmp_path / "pooled.json", tmp_path / "alone.json"
    assert _summarize(folder, pooled, deadline=60.0).returncode in (0, 1)
    script = (f"import sys, torch; from pathlib import Path; from lightning_ncclx.cli.summarize import run_summarize; "
              f"sys.exit(run_summarize(Path({str(folder)!r}), fmt='json', output=Path({str(alone)!r})))")
    assert subprocess.run([sys.executable, "-c", script], timeout=240, cwd=REPO).returncode in (0, 1)  # torch loaded: no fork
    assert json.loads(pooled.read_text()) == json.loads(alone.read_text())


def test_the_deadline_grows_with_the_file(tmp_path) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(b"x")
    with open(big, "wb") as fh:
        fh.truncate(30 << 20)
    assert deadline_s(str(small)) == pytest.approx(DEADLINE_S, abs=0.01)
    assert deadline_s(str(big)) == pytest.approx(DEADLINE_S + 30, abs=0.01)
    assert deadline_s(str(tmp_path / "missing")) == DEADLINE_S


def test_forking_is_refused_inside_a_process_that_runs_torch() -> None:
    code = "import torch; from lightning_ncclx.analysis.reader_pool import fork_safe; print(fork_safe())"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO).stdout.strip() == "False"
    code = "from lightning_ncclx.analysis.reader_pool import fork_safe; print(fork_safe())"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO).stdout.strip() == "True"
    assert isinstance(fork_safe(), bool)
