"""Two "hosts" on one machine: network namespaces joined by a veth pair, each with its own
hostname (a UTS namespace per process tree) and its own dump folder.

Only ``ip`` and ``unshare`` (iproute2, util-linux) are used, as root. Addresses are assigned inside
the namespaces only and no route leads anywhere else. :meth:`TwoHosts.destroy` kills every process
in both namespaces and deletes them (which deletes the veth pair); it is safe to call twice and
after a partial :meth:`TwoHosts.create`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

SUBNET_PREFIX = "10.77.0"


class NamespacesUnavailable(RuntimeError):
    """The machine does not let this test make network namespaces (reason in the message)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class Host:
    index: int
    netns: str
    veth: str
    address: str
    hostname: str
    root: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def pids(self) -> list[int]:
        """Every process that lives in this host's network namespace."""
        done = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in done.stdout.split() if p.strip().isdigit()]


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can (probes with a throwaway one)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if shutil.which("unshare") is None:
        return "util-linux's `unshare` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"ncxprobe{secrets.token_hex(3)}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip() or done.returncode}"
    _ip("netns", "del", probe, check=False)
    uts = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True, timeout=30)
    if uts.returncode != 0:
        return f"`unshare --uts` failed: {uts.stderr.strip() or uts.returncode}"
    return None


class TwoHosts:
    """``host_a`` (10.77.0.1, node rank 0) and ``host_b`` (10.77.0.2, node rank 1)."""

    def __init__(self, base: Path, tag: str | None = None) -> None:
        tag = tag or secrets.token_hex(3)
        self.tag = tag
        self.hosts = [
            Host(i, f"ncx{tag}{c}", f"vx{tag}{c}", f"{SUBNET_PREFIX}.{i + 1}", f"node-{c}-{tag}", base / f"host_{c}")
            for i, c in enumerate("ab")
        ]
        self._created: list[str] = []
        self._veth_made = False

    @property
    def a(self) -> Host:
        return self.hosts[0]

    @property
    def b(self) -> Host:
        return self.hosts[1]

    def create(self) -> None:
        for host in self.hosts:
            _ip("netns", "add", host.netns)
            self._created.append(host.netns)
            host.root.mkdir(parents=True, exist_ok=True)
        a, b = self.hosts
        _ip("link", "add", a.veth, "type", "veth", "peer", "name", b.veth)
        self._veth_made = True
        for host in self.hosts:
            _ip("link", "set", host.veth, "netns", host.netns)
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.veth)
            _ip("-n", host.netns, "link", "set", host.veth, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        self._wait_reachable()

    def _wait_reachable(self, timeout: float = 10.0) -> None:
        """The veth link takes a moment to come up (IPv6 DAD does not matter: IPv4 only)."""
        deadline = time.monotonic() + timeout
        while True:
            state = _ip("-n", self.a.netns, "-o", "link", "show", self.a.veth).stdout
            if "LOWER_UP" in state or time.monotonic() > deadline:
                return
            time.sleep(0.1)

    def popen(self, host: Host, argv: Sequence[str], *, env: Mapping[str, str], log: Path,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host``: its network namespace, a new UTS namespace with the host's
        name, a new process session (so the test can kill the group)."""
        command = ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c",
                   'hostname "$0" && exec "$@"', host.hostname, *argv]
        out = open(log, "ab")  # noqa: SIM115 - the child holds it; closed below
        try:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                                    cwd=str(cwd) if cwd else None, start_new_session=True)
        finally:
            out.close()
        host.processes.append(proc)
        return proc

    def kill_host(self, host: Host, *, cut_link_first: bool = False) -> list[int]:
        """The whole host dies: optionally its link goes down first (no FIN/RST reaches the
        peer, as when a node loses power), then SIGKILL to every process in its namespace."""
        if cut_link_first:
            _ip("-n", host.netns, "link", "set", host.veth, "down", check=False)
        killed: list[int] = []
        for _ in range(5):  # a dying launcher may still be forking: repeat until empty
            pids = host.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for proc in host.processes:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in host.processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        return killed

    def destroy(self) -> list[str]:
        """Kill everything, delete namespaces (and with them the veth pair). Returns problems."""
        problems: list[str] = []
        for host in self.hosts:
            if host.netns in self._created:
                self.kill_host(host)
                if host.pids():
                    problems.append(f"processes {host.pids()} survive in {host.netns}")
            else:
                for proc in host.processes:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        for name in list(self._created):
            done = _ip("netns", "del", name, check=False)
            if done.returncode != 0:
                problems.append(f"ip netns del {name}: {done.stderr.strip()}")
            else:
                self._created.remove(name)
        if self._veth_made:  # normally gone with its namespace; left in the root namespace if a move failed
            for host in self.hosts:
                if _ip("link", "show", host.veth, check=False).returncode == 0:
                    _ip("link", "del", host.veth, check=False)
        return problems
