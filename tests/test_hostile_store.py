"""The hostile-store test tools themselves (``hostile_store``, ``hostile_payloads``,
``hostile_checks``): against a real TCPStore server, a real 2-rank job, real processes."""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import random
import subprocess
import sys
import tarfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch.distributed as dist

from hostile_checks import PeakRss, Sandbox, peak_rss_wrapped, read_peak_rss
from hostile_payloads import (
    HOSTILE_NUMBERS, NON_UTF8, NOT_AN_OBJECT, TarMember, escaping_names, gzip_bomb, incompressible_tar_gz,
    json_with, random_values, tar_gz,
)
from hostile_store import JOB_STORE_PREFIX, PLUGIN_PREFIX, STORE_VALUE_LIMIT_BYTES, HostileStore
from support import clean_env, free_port, kill_session, start_job

JOB = Path(__file__).parent / "watchdog" / "jobs" / "train_job.py"
MiB = 1024 * 1024


@pytest.fixture
def server() -> Iterator[Any]:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield master


def _jobs_view(master: Any) -> Any:
    """The store as a job's plugin code sees it: its namespace at the server's root."""
    return dist.PrefixStore("lightning_ncclx", master)


# ---------------------------------------------------------------------------------- the client
def test_the_client_reads_writes_lists_and_deletes_the_keys_a_job_makes(server) -> None:
    job = _jobs_view(server)
    job.set("ev/1/meta", '{"name": "stall-001"}')
    with HostileStore("127.0.0.1", server.port) as hostile:
        assert hostile.full_key("ev/1/meta") == "lightning_ncclx/ev/1/meta"
        assert hostile.names() == ["ev/1/meta"] and hostile.get("ev/1/meta") == b'{"name": "stall-001"}'
        hostile.set("ev/1/rank/1", b'{"host": ".."}')
        assert job.get("ev/1/rank/1") == b'{"host": ".."}'
        assert hostile.names("ev/1/rank/") == ["ev/1/rank/1"]
        assert hostile.delete("ev/1/meta") is True and not job.check(["ev/1/meta"])
        assert hostile.get("ev/1/meta") is None and hostile.exists("ev/1/rank/1")
        assert hostile.add("ev/1/dumped", 5) == 5 and job.add("ev/1/dumped", 0) == 5


def test_a_raw_client_sees_the_whole_server(server) -> None:
    server.set("outside/any/prefix", "1")
    with HostileStore("127.0.0.1", server.port, prefix="") as hostile:
        assert hostile.names() == ["outside/any/prefix"]


def test_an_action_runs_when_its_key_appears(server) -> None:
    job = _jobs_view(server)
    with HostileStore("127.0.0.1", server.port) as hostile:
        planted = hostile.when("ev/2/meta", lambda h: h.set("ev/2/want", "[0, 1]") or "planted", timeout_seconds=60)
        job.set("ev/2/meta", "{}")
        assert planted.result(timeout_seconds=60) == "planted"
        assert job.get("ev/2/want") == b"[0, 1]"
        assert hostile.wait_for("never/there", timeout_seconds=0.0) is False
        late = hostile.when(lambda names: "x" in names, lambda h: None, timeout_seconds=0.0)
        with pytest.raises(TimeoutError, match="did not happen"):
            late.result(timeout_seconds=60)


def test_a_value_over_the_stores_limit_is_refused_and_the_client_reconnects(server) -> None:
    blob = incompressible_tar_gz(9 * MiB)
    assert len(blob) > STORE_VALUE_LIMIT_BYTES
    with HostileStore("127.0.0.1", server.port) as hostile:
        assert hostile.try_set("ev/1/blob/1", blob) is False  # the server closed that connection
        hostile.set("ev/1/blob/1", b"small")  # a new one works
        assert _jobs_view(server).get("ev/1/blob/1") == b"small"


@pytest.mark.timeout(240)
def test_a_running_two_rank_jobs_plugin_keys_are_under_the_plugin_prefix(tmp_path: Path) -> None:
    """A real 2-rank ``ddp_ncclx`` job with an on-demand dump: every key of the plugin on the
    server starts with ``PLUGIN_PREFIX``, torch's own with ``JOB_STORE_PREFIX``."""
    port = free_port()
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    argv = [sys.executable, str(JOB), "--dump-dir", str(tmp_path / "dumps"), "--devices", "2", "--fault", "signal",
            "--fault-rank", "0", "--at-batch", "4", "--batches", "12", "--step-sleep", "0.1", "--on-stall", "dump",
            "--strategy", "ddp_ncclx"]
    proc = start_job(argv, env=env, cwd=tmp_path, log=tmp_path / "job.log")
    seen: set[str] = set()
    try:
        with HostileStore("127.0.0.1", port, prefix="", timeout_seconds=60) as raw:
            raw.wait_for(lambda names: seen.update(names) or any("/ev/1/meta" in n for n in names)
                         or proc.poll() is not None, timeout_seconds=180)
            ours = HostileStore("127.0.0.1", port)
            closed = ours.wait_for(lambda names: b'"closed"' in (ours.get("ev/1/meta") or b""), timeout_seconds=180)
            seen.update(raw.names())
        assert closed, (tmp_path / "job.log").read_text()[-3000:]
        assert proc.wait(timeout=180) == 0, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        kill_session(proc)
        proc.wait()
    plugin = sorted(k for k in seen if "lightning_ncclx" in k)
    assert plugin and all(k.startswith(PLUGIN_PREFIX) for k in plugin), plugin
    assert {"cs/rank/0", "cs/rank/1", "ev/1/meta"} <= {k[len(PLUGIN_PREFIX):] for k in plugin}, plugin
    assert any(k[len(PLUGIN_PREFIX):].startswith("procs/") for k in plugin), plugin
    assert all(k.startswith((JOB_STORE_PREFIX, PLUGIN_PREFIX)) for k in seen), sorted(seen)


# ---------------------------------------------------------------------------------- payloads
def test_a_gzip_bomb_is_small_and_inflates_to_what_it_says() -> None:
    blob = gzip_bomb(64 * MiB, "rank_00000.context.json")
    assert len(blob) < 128 * 1024
    with tarfile.open(fileobj=gzip.GzipFile(fileobj=io.BytesIO(blob)), mode="r|") as tar:
        member = next(iter(tar))
        assert (member.name, member.size) == ("rank_00000.context.json", 64 * MiB)
        handle = tar.extractfile(member)
        inflated = 0
        while chunk := handle.read(MiB):
            inflated += len(chunk)
    assert inflated == 64 * MiB


def test_crafted_tars_hold_exactly_the_members_asked_for() -> None:
    blob = tar_gz([TarMember("../escaped.json", b"{}"), TarMember("/abs/path", b"x"),
                   TarMember("link", kind="symlink", target="/etc/passwd"),
                   TarMember("hard", kind="hardlink", target="../escaped.json"), TarMember("dev", kind="chardev")])
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        members = [(m.name, m.type, m.linkname) for m in tar.getmembers()]
    assert members == [("../escaped.json", tarfile.REGTYPE, ""), ("/abs/path", tarfile.REGTYPE, ""),
                       ("link", tarfile.SYMTYPE, "/etc/passwd"), ("hard", tarfile.LNKTYPE, "../escaped.json"),
                       ("dev", tarfile.CHRTYPE, "")]


def test_escaping_names_lead_out_of_the_folder(tmp_path: Path) -> None:
    folder, target = tmp_path / "sandbox" / "dumps", tmp_path / "sandbox" / "home" / ".ssh"
    for name in escaping_names(folder, target)[:4]:
        assert os.path.normpath(folder / name) == str(target), name


def test_hostile_numbers_and_texts_are_what_a_careless_reader_trips_on() -> None:
    base = {"initiator": 0, "reason": "stall"}
    assert math.isnan(json.loads(json_with(base, "initiator", "NaN"))["initiator"])
    assert json.loads(json_with(base, "initiator", "1e999"))["initiator"] == math.inf
    assert "1" * 5000 in HOSTILE_NUMBERS
    with pytest.raises(ValueError, match="digits"):
        json.loads(json_with(base, "initiator", "1" * 5000))
    assert not any(isinstance(json.loads(text), dict) for text in NOT_AN_OBJECT if _parses(text))
    for raw in NON_UTF8[:4]:
        with pytest.raises(UnicodeDecodeError):
            raw.decode("utf-8")


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_the_random_mix_is_repeatable_from_its_seed_and_bounded() -> None:
    first = list(random_values(random.Random(7), 300, max_bytes=4096))
    assert first == list(random_values(random.Random(7), 300, max_bytes=4096))
    assert all(isinstance(v, bytes) and len(v) < 8192 for v in first)
    assert len(set(first)) > 100


# ---------------------------------------------------------------------------------- checks
def test_the_sandbox_reports_every_write_outside_the_dump_folder(tmp_path: Path) -> None:
    sandbox = Sandbox.create(tmp_path)
    before = sandbox.snapshot()
    (sandbox.dump_dir / "stall-001").mkdir()
    (sandbox.dump_dir / "stall-001" / "summary.json").write_text("{}")
    assert sandbox.written_outside(before) == []
    (sandbox.home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA-attacker\n")
    (sandbox.root / "escaped").mkdir()
    (sandbox.root / "escaped" / "x").write_text("x")
    (sandbox.home / ".bashrc").unlink()
    (sandbox.home / "link").symlink_to("/etc/passwd")
    (sandbox.root / "logs").mkdir()
    assert sandbox.written_outside(before, allowed=[sandbox.root / "logs"]) == [
        "+ escaped", "+ escaped/x", "+ home/link", "- home/.bashrc", "~ home/.ssh/authorized_keys"]
    assert sandbox.env()["HOME"] == str(sandbox.home)


ALLOCATE = "import sys; block = bytearray({size}); block[::4096] = b'x' * len(block[::4096]); {then}"


def test_peak_rss_of_a_running_process_is_seen_with_its_rank(tmp_path: Path) -> None:
    script = ALLOCATE.format(size=200 * MiB, then="print('ready', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=clean_env({"RANK": "3"}))
    try:
        assert proc.stdout.readline() == b"ready\n"
        watcher = PeakRss(proc.pid)
        deadline = time.monotonic() + 60
        while watcher.peaks.get(proc.pid, 0) < 200 * MiB and time.monotonic() < deadline:
            time.sleep(0.05)
        peaks = watcher.stop()
        assert 200 * MiB <= peaks[proc.pid] < 1024 * MiB and watcher.ranks[proc.pid] == 3
    finally:
        proc.kill()
        proc.wait()


def test_the_wrapper_reports_the_largest_peak_of_a_job_even_from_an_orphaned_rank(tmp_path: Path) -> None:
    """The 300 MiB process is orphaned (its parent exits first): the wrapper still reaps and counts it."""
    grandchild = ALLOCATE.format(size=300 * MiB, then="import time; time.sleep(1)")
    parent = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {grandchild!r}])"
    report = tmp_path / "peak.json"
    code = subprocess.call(peak_rss_wrapped([sys.executable, "-c", parent], report), env=clean_env())
    assert code == 0
    assert 300 * MiB <= read_peak_rss(report) < 1024 * MiB
