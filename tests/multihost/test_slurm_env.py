"""The multi-node job under SLURM's environment: 4 ranks on 2 "nodes", started by hand with the
variables ``srun --nodes=2 --ntasks-per-node=2`` gives every task (there is no SLURM here).
Lightning picks ``SLURMEnvironment`` by itself; nothing of the plugin's launches anything.

Two variants: both "nodes" on this machine (always runs), and each node in its own network
namespace with its own hostname (needs root and ``ip netns``, like ``test_two_hosts``). Each node
has its own ``TMPDIR`` and the job's dump folder is ``$TMPDIR/ncclx/$SLURM_JOB_ID``, expanded by
every rank, as in ``examples/slurm/train.sbatch``. Rank 3 stalls; the summary must give the same
verdict and culprit as the torchrun test.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from multihost.helpers import JOB, STALL_EXIT_CODE, contexts, event_folders, read_logs, wait_all
from support import PYTHON, clean_env, free_port, kill_session, start_job
from lightning_ncclx.analysis.rank_sets import rank_map

pytestmark = pytest.mark.timeout(240)

GATHER = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "gather_dumps.sh"

NODES, TASKS_PER_NODE = 2, 2
WORLD = NODES * TASKS_PER_NODE


def slurm_task_env(rank: int, job_id: str, nodelist: str, node_names: list[str], tmpdir: Path) -> dict[str, str]:
    """What srun exports to task ``rank`` of ``srun --nodes=2 --ntasks-per-node=2`` (the ones
    Lightning and lightning-ncclx read, and a few more for realism)."""
    node = rank // TASKS_PER_NODE
    return {
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "ncclx-multinode",
        "SLURM_NTASKS": str(WORLD), "SLURM_NPROCS": str(WORLD), "SLURM_NTASKS_PER_NODE": str(TASKS_PER_NODE),
        "SLURM_TASKS_PER_NODE": f"{TASKS_PER_NODE}(x{NODES})", "SLURM_NNODES": str(NODES),
        "SLURM_JOB_NUM_NODES": str(NODES), "SLURM_NODELIST": nodelist, "SLURM_JOB_NODELIST": nodelist,
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % TASKS_PER_NODE), "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": node_names[node], "SLURM_CPUS_ON_NODE": "2", "SLURM_SUBMIT_DIR": str(tmpdir.parent),
        "TMPDIR": str(tmpdir), "OMP_NUM_THREADS": "1",
    }


JOB_ARGS = ["--num-nodes", str(NODES), "--devices", str(TASKS_PER_NODE),
            "--dump-dir", "$TMPDIR/ncclx/$SLURM_JOB_ID",  # expanded by each rank, on its own node
            "--fault", "stuck_train", "--fault-rank", "3", "--at-batch", "3", "--batches", "8",
            "--train-step-seconds", "4", "--slow-node", "1", "--slow-node-threshold", "90"]


def _check_outcome(job_id: str, node_tmp: list[Path], hostnames: list[str], codes: list[int | None], text: str) -> None:
    assert None not in codes, f"ranks still running: {codes}\n{text}"
    assert codes == [STALL_EXIT_CODE] * WORLD, f"exit codes {codes}\n{text}"
    dump_roots = [tmp / "ncclx" / job_id for tmp in node_tmp]
    assert [p.name for p in event_folders(dump_roots[0])] == ["stall-001"], text
    folder = dump_roots[0] / "stall-001"
    node1 = dump_roots[1] / "stall-001"
    assert sorted(contexts(node1)) == [2, 3], "node 1's ranks did not dump on node 1's disk"
    assert not (node1 / "summary.json").exists()

    found = contexts(folder)
    assert sorted(found) == list(range(WORLD)), f"dumps on node 0: {sorted(found)}\n{text}"
    for rank, ctx in found.items():
        assert ctx["node_rank"] == rank // TASKS_PER_NODE and ctx["local_rank"] == rank % TASKS_PER_NODE
        assert ctx["host"] == hostnames[rank // TASKS_PER_NODE]
    assert {ctx["initiator_rank"] for ctx in found.values()} <= {0, 1}
    collection = json.loads((folder / "collection.json").read_text())
    assert collection["missing_ranks"] == [] and set(collection["gathered"]) == {"2", "3"}

    summary = json.loads((folder / "summary.json").read_text())
    assert summary["verdict"] == "not_entered" and summary["culprit_ranks"] == [3], summary.get("headline")
    assert rank_map(summary, "host_ranks", "hosts")[3] == hostnames[1]
    for name in ("summary.txt", "summary.html"):
        assert (folder / name).is_file()
    assert "SLURMEnvironment" in text


def test_slurm_variables_two_nodes_on_one_machine(tmp_path: Path) -> None:
    job_id = str(70000 + secrets.randbelow(9999))
    node_tmp = [tmp_path / f"node{n}_tmp" for n in range(NODES)]
    hostnames = [socket.gethostname()] * NODES
    node_names = [f"node{n}" for n in range(NODES)]  # SLURMD_NODENAME; one hostname for both here
    port = free_port()
    procs, logs = [], []
    try:
        for rank in range(WORLD):
            node = rank // TASKS_PER_NODE
            node_tmp[node].mkdir(exist_ok=True)
            env = clean_env({**slurm_task_env(rank, job_id, "127.0.0.1", node_names, node_tmp[node]),
                             "MASTER_PORT": str(port)})  # one machine: a free port, not the job-id one
            logs.append(tmp_path / f"task_{rank}.log")
            procs.append(start_job([PYTHON, str(JOB), *JOB_ARGS], env=env, cwd=tmp_path, log=logs[-1]))
        codes = wait_all(procs, timeout=150)
    finally:
        for proc in procs:
            kill_session(proc)
            proc.wait()
    _check_outcome(job_id, node_tmp, hostnames, codes, read_logs(logs))

    # examples/slurm/train.sbatch's last steps: each node's folder to the shared log folder, then
    # one summary per event from every node's copy
    shared = tmp_path / "shared" / "ncclx_dumps"
    for node in range(NODES):
        env = clean_env({**slurm_task_env(node * TASKS_PER_NODE, job_id, "127.0.0.1", node_names, node_tmp[node]),
                         "NCCLX_PYTHON": PYTHON})
        done = subprocess.run(["bash", str(GATHER), "node", f"{node_tmp[node]}/ncclx/{job_id}", str(shared)],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(["bash", str(GATHER), "merge", str(shared)], env=clean_env({"NCCLX_PYTHON": PYTHON}),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (shared / "nodes").iterdir()) == node_names
    merged = shared / "stall-001"
    assert sorted(p.name for p in (merged / "ranks").iterdir()) == node_names
    summary = json.loads((merged / "summary.json").read_text())
    assert summary["verdict"] == "not_entered" and summary["culprit_ranks"] == [3], done.stdout
    assert summary["ranks_seen"] == list(range(WORLD)) and summary["ranks_missing"] == []
    assert (merged / "summary.txt").is_file() and (merged / "summary.html").is_file()
    assert (merged / "ranks" / "node0" / "summary.json").is_file(), "the job's own summary should be kept"


def test_slurm_variables_two_nodes_in_namespaces(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    two_hosts: Any = request.getfixturevalue("two_hosts")  # skips where namespaces are unavailable
    job_id = str(70000 + secrets.randbelow(9999))
    hosts = two_hosts.hosts
    hostnames = [h.hostname for h in hosts]
    node_tmp = [h.root / "tmp" for h in hosts]
    nodelist = "10.77.0.[1-2]"  # SLURM's range notation; Lightning takes the first as MASTER_ADDR
    logs = []
    procs = []
    for rank in range(WORLD):
        node = rank // TASKS_PER_NODE
        node_tmp[node].mkdir(exist_ok=True)
        # no MASTER_ADDR/MASTER_PORT: Lightning derives them from SLURM_NODELIST and SLURM_JOB_ID
        env = clean_env({**slurm_task_env(rank, job_id, nodelist, hostnames, node_tmp[node]),
                         "GLOO_SOCKET_IFNAME": hosts[node].veth})
        logs.append(hosts[node].root / f"task_{rank}.log")
        procs.append(two_hosts.popen(hosts[node], [PYTHON, str(JOB), *JOB_ARGS], env=env, log=logs[-1],
                                     cwd=hosts[node].root))
    codes = wait_all(procs, timeout=150)  # the fixture kills whatever is left
    _check_outcome(job_id, node_tmp, hostnames, codes, read_logs(logs))
