"""Two hosts under torchrun (static rendezvous), node-local dump folders, no shared filesystem.

Each host is a network namespace with its own hostname, joined to the other by a veth pair;
each runs ``torchrun --nnodes=2 --nproc_per_node=2 --node_rank=N`` of a Lightning job on
``ddp_ncclx`` (gloo on CPU, ``GLOO_SOCKET_IFNAME`` = its veth). Each host writes its dumps to its
own folder. The TCPStore lives in host A's torchrun agent (static rendezvous, master 10.77.0.1).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from multihost.helpers import JOB, STALL_EXIT_CODE, contexts, event_folders as _event_folders, wait_all
from multihost.netns import Host, TwoHosts
from support import PYTHON, clean_env
from lightning_ncclx.analysis.rank_sets import rank_map

pytestmark = pytest.mark.timeout(240)

TORCHRUN = str(Path(PYTHON).parent / "torchrun")
MASTER_PORT = 29531  # the namespaces are fresh: no other listener can hold it
NODE_DIR_VARIABLE = "NCCLX_TEST_NODE_DIR"


def start_node(hosts: TwoHosts, host: Host, job_args: list[str]) -> Any:
    env = clean_env({
        "GLOO_SOCKET_IFNAME": host.veth, "OMP_NUM_THREADS": "1", NODE_DIR_VARIABLE: str(host.root),
        "LOGLEVEL": "WARNING",
    })
    argv = [TORCHRUN, "--nnodes=2", "--nproc_per_node=2", f"--node_rank={host.index}",
            f"--master_addr={hosts.a.address}", f"--master_port={MASTER_PORT}", "--max_restarts=0",
            str(JOB), "--num-nodes", "2", "--devices", "2",
            # one command line for both nodes: each rank expands the variable on its own host
            "--dump-dir", f"${NODE_DIR_VARIABLE}/ncclx", "--progress-dir", f"${NODE_DIR_VARIABLE}/progress",
            *job_args]
    (host.root / "progress").mkdir(parents=True, exist_ok=True)
    return hosts.popen(host, argv, env=env, log=host.root / "torchrun.log", cwd=host.root)


def logs(hosts: TwoHosts) -> str:
    parts = []
    for host in hosts.hosts:
        path = host.root / "torchrun.log"
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        parts.append(f"===== {host.hostname} ({host.netns}) =====\n{text[-5000:]}")
    return "\n".join(parts)


def event_folders(host: Host) -> list[Path]:
    return _event_folders(host.root / "ncclx")


def test_stall_on_second_host_is_summarized_on_first_with_every_trace(two_hosts: TwoHosts) -> None:
    """Rank 3 (host B) sleeps inside training_step; host A's ranks notice first (host B's ranks
    have a long threshold), dump, pull host B's dumps through the store and summarize."""
    args = ["--fault", "stuck_train", "--fault-rank", "3", "--at-batch", "3", "--batches", "8",
            "--train-step-seconds", "4", "--slow-node", "1", "--slow-node-threshold", "90"]
    procs = [start_node(two_hosts, host, args) for host in two_hosts.hosts]
    codes = wait_all(procs, timeout=150)
    text = logs(two_hosts)
    assert None not in codes, f"torchrun did not finish: {codes}\n{text}"
    a, b = two_hosts.a, two_hosts.b

    assert [p.name for p in event_folders(a)] == ["stall-001"], text
    folder = a.root / "ncclx" / "stall-001"
    assert (folder / "summary.json").is_file(), f"no summary on host A\n{text}"
    # node-local: host B wrote its own ranks' dumps on its own disk, and no summary
    b_folder = b.root / "ncclx" / "stall-001"
    assert sorted(contexts(b_folder)) == [2, 3], text
    assert not (b_folder / "summary.json").exists()
    assert not list(folder.glob("rank_00002.*")) and not list(folder.glob("rank_00003.*")), \
        "host B's ranks wrote into host A's folder: the folders are not node-local"

    # every rank's trace is on host A: its own at the top, host B's gathered under ranks/<host B>/
    found = contexts(folder)
    assert sorted(found) == [0, 1, 2, 3], f"dumps on host A: {sorted(found)}\n{text}"
    for rank, ctx in found.items():
        expected_host = a.hostname if rank < 2 else b.hostname
        assert ctx["host"] == expected_host, (rank, ctx["host"])
        assert ctx["node_rank"] == (0 if rank < 2 else 1)
        assert ctx["trace_files"], f"rank {rank} wrote no flight-recorder trace"
        where = folder if rank < 2 else folder / "ranks" / b.hostname
        for name in ctx["trace_files"] + [ctx["stacks_file"]]:
            assert (where / name).is_file(), f"{where / name} missing"
    assert {ctx["initiator_rank"] for ctx in found.values()} <= {0, 1}

    collection = json.loads((folder / "collection.json").read_text())
    assert collection["missing_ranks"] == []
    assert set(collection["gathered"]) == {"2", "3"}

    summary = json.loads((folder / "summary.json").read_text())
    assert summary["verdict"] == "not_entered" and summary["culprit_ranks"] == [3], \
        f"verdict {summary.get('verdict')}: {summary.get('headline')}"
    hosts = rank_map(summary, "host_ranks", "hosts")
    assert hosts[3] == b.hostname and hosts[0] == a.hostname
    assert set(summary["dump_locations"]) == {a.hostname, b.hostname}, summary["dump_locations"]
    assert any(str(folder / "ranks" / b.hostname) in p for p in summary["dump_locations"][b.hostname])
    culprit_row = next(row for row in summary["per_rank"] if row["rank"] == 3)
    assert culprit_row["host"] == b.hostname and culprit_row["state"] != "in_collective", culprit_row
    assert b.hostname in (folder / "summary.html").read_text()  # the per-rank table names hosts
    assert "culprit rank(s) 3" in (folder / "summary.txt").read_text()

    # every rank ended with the stall exit code, so torchrun reports failure on both hosts
    assert codes == [1, 1], f"torchrun exit codes {codes}\n{text}"
    assert f"exitcode  : {STALL_EXIT_CODE}" in text, text
    # torch's own dump-on-timeout folder is set up per node (gloo never writes into it)
    assert (a.root / "ncclx" / "torch").is_dir() and (b.root / "ncclx" / "torch").is_dir()


def wait_for_batch(hosts: TwoHosts, batch: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((h.root / "progress" / f"rank_{r}.batch_{batch}").exists()
               for h, r in ((hosts.a, 0), (hosts.a, 1), (hosts.b, 2), (hosts.b, 3))):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("cut_link_first", [True, False], ids=["power-loss", "processes-killed"])
def test_whole_second_host_lost_mid_run(two_hosts: TwoHosts, cut_link_first: bool) -> None:
    """Host B disappears while training: every process in its namespace is SIGKILLed (with its
    link cut first, the peers see nothing, as when a node loses power; without, the kernel
    closes host B's sockets and gloo on host A fails). Host A must still write the summary,
    naming ranks 2 and 3 as lost."""
    args = ["--batches", "100000", "--step-sleep", "0.1", "--train-step-seconds", "4", "--collect-timeout", "8"]
    procs = [start_node(two_hosts, host, args) for host in two_hosts.hosts]
    started = wait_for_batch(two_hosts, 3, timeout=90)
    assert started, f"the job did not reach batch 3\n{logs(two_hosts)}"
    killed = two_hosts.kill_host(two_hosts.b, cut_link_first=cut_link_first)
    assert killed, "nothing was running on host B"
    assert not two_hosts.b.pids()
    codes = wait_all(procs[:1], timeout=90)
    text = logs(two_hosts)
    assert codes[0] is not None, f"host A's torchrun did not finish after host B died\n{text}"
    a = two_hosts.a

    events = event_folders(a)
    assert len(events) == 1, f"events on host A: {[e.name for e in events]}\n{text}"
    folder = events[0]
    if cut_link_first:  # nothing tells host A: only its stall watchdog can notice
        assert folder.name == "stall-001", text
    else:  # host A sees its peers' sockets close: the collective fails, or the watchdog fires first
        assert folder.name.startswith(("stall-", "exception-")), folder.name
    assert sorted(contexts(folder)) == [0, 1], text
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["dumped_ranks"] == [0, 1] and collection["missing_ranks"] == [2, 3], collection
    summary_path = folder / "summary.json"
    assert summary_path.is_file(), f"host A wrote no summary\n{text}"
    summary = json.loads(summary_path.read_text())
    assert summary["ranks_missing"] == [2, 3], summary.get("ranks_missing")
    assert set(summary["dump_locations"]) == {a.hostname}
    lost_rows = {row["rank"]: row for row in summary["per_rank"] if row["rank"] in (2, 3)}
    assert sorted(lost_rows) == [2, 3], summary["per_rank"]
    assert codes[0] != 0
    # Also when host A's collective failed ("Connection closed by peer") and its ranks agree with
    # each other: a lost node never reads as "no hang".
    assert summary["verdict"] == "dump_missing", summary["headline"]
    assert summary["culprit_ranks"] == [2, 3], summary["headline"]
