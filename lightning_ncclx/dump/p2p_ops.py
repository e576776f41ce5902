"""Point-to-point ops in flight on this rank, where the flight recorder does not show them.

gloo's recorder keeps no send or recv (its op counter counts them, no entry is written), so a rank
blocked in ``recv`` or ``irecv().wait()`` looked idle to the consensus probe and to the analyzer.
torch >= 2.15 calls Python hooks around every op of a ProcessGroup (``register_pre_hook`` /
``register_post_hook``, the mechanism its own NCCL recorder hook uses); while the watchdog runs,
:class:`P2PTracker` hooks every group a gloo backend serves and keeps one record per send or recv
until the op's ``Work`` completes. NCCL groups are never hooked: their recorders (legacy NCCL,
nccl2's hook) record send and recv with their state.

Cost: two Python calls per op of a hooked group that return at once for a collective (about 3 µs
each op on gloo, measured by ``bench/bench_consensus.py probe``); a send or recv adds one record.
Completed records are dropped at the next send or recv and at every look, so a completed op's
tensors are held at most until then; at most ``MAX_IN_FLIGHT`` records are kept.

Hooks are attached and removed only from the main thread between steps (the callback's ``setup``,
batch starts, teardown), never while another thread may be inside one of the group's ops.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger(__name__)

HOOK_ID = 0x4E43584C
"""The id the hooks are registered under on each group (``NCXL``)."""
MAX_IN_FLIGHT = 256
MAX_LISTED = 32
"""In-flight ops written to context.json."""


@dataclass(frozen=True, order=True)
class P2PInFlight:
    """One send or recv this rank started and that has not completed."""

    group: str
    """The process group's name (as in ``pg_config`` and the recorder's ``process_group``)."""
    op_id: int
    """The group's op counter (it counts collectives and p2p alike, as ``pg_status`` does)."""
    op: str
    """``send`` or ``recv``."""
    src: int
    """Group rank of the sender (-1: any source)."""
    dst: int
    """Group rank of the receiver."""
    peer: int
    """Global rank of the other side (-1: unknown or any source)."""
    backend: str = "gloo"
    sizes: tuple[tuple[int, ...], ...] = ()
    dtype: str = ""
    started: float = 0.0
    """``time.monotonic()`` when it was issued."""

    def label(self) -> str:
        other = f"rank {self.peer}" if self.peer >= 0 else "any rank"
        return f"{self.op} {'to' if self.op == 'send' else 'from'} {other} (group {self.group}, op {self.op_id})"

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """The ``p2p_in_flight`` item of context.json (see docs/dump-format.md)."""
        waited = None if now is None else round(max(0.0, now - self.started), 3)
        return {"backend": self.backend, "group": self.group, "op": self.op, "src": self.src, "dst": self.dst,
                "peer": self.peer, "op_id": self.op_id, "sizes": [list(s) for s in self.sizes],
                "dtype": self.dtype, "seconds": waited}


@dataclass
class _Pending:
    op: P2PInFlight
    work: Any = None


class _GroupHooks:
    """The pre/post hooks of one process group; they write into the tracker's table."""

    def __init__(self, tracker: "P2PTracker", group: str, my_rank: int, to_global: Callable[[int], int],
                 p2p_names: frozenset) -> None:
        self.tracker, self.group, self.my_rank = tracker, group, my_rank
        self.to_global, self.p2p_names = to_global, p2p_names

    def pre(self, args: Any) -> None:
        name = args.name
        if name not in self.p2p_names or not self.tracker.active:
            return
        try:
            send = str(name).endswith("SEND")
            tensors = args.input_tensors if send else args.output_tensors
            if tensors and tensors[0].device.type != "cpu":
                return  # a mixed group's CUDA op: NCCL serves it, and its recorder holds it
            peer = int(args.root)
            op = P2PInFlight(self.group, int(args.op_id), "send" if send else "recv",
                             self.my_rank if send else peer, peer if send else self.my_rank,
                             self.to_global(peer) if peer >= 0 else -1,
                             sizes=tuple(tuple(t.shape) for t in tensors[:4]),
                             dtype=str(tensors[0].dtype).removeprefix("torch.") if tensors else "",
                             started=time.monotonic())
            self.tracker._add(op)
        except Exception:  # noqa: BLE001 - a hook must never fail the user's op
            self.tracker._note_failure()

    def post(self, args: Any) -> None:
        if args.name not in self.p2p_names or not self.tracker.active:
            return
        try:
            self.tracker._set_work(self.group, int(args.op_id), args.work)
        except Exception:  # noqa: BLE001
            self.tracker._note_failure()


class P2PTracker:
    """The in-flight sends and recvs of this process's gloo groups (see the module docstring)."""

    def __init__(self) -> None:
        self.active = False
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._hooked: dict[int, tuple[weakref.ref, _GroupHooks]] = {}
        self._known_groups = -1
        self._failures = 0
        self._exit_hook = False

    # ------------------------------------------------------------------ main thread, between steps
    def attach(self) -> int:
        """Hook every gloo group not hooked yet; cheap when no group was created since the last
        call. Returns how many groups are hooked. Never raises."""
        self.active = True
        if not self._exit_hook:
            # hooks left on a group (after an exception) would be called or released by torch's
            # C++ after Python has finalized, and crash the process (SIGSEGV) as it exits
            atexit.register(self.detach)
            self._exit_hook = True
        try:
            return self._attach_new()
        except Exception:  # noqa: BLE001
            log.warning("watching point-to-point ops failed; sends and recvs stay invisible on gloo",
                        exc_info=True)
            return len(self._hooked)

    def detach(self) -> None:
        """Remove every hook (the main thread, at the end of the run)."""
        self.active = False
        hooked, self._hooked = self._hooked, {}
        self._known_groups = -1
        for ref, _ in hooked.values():
            group = ref()
            if group is None:
                continue
            try:
                group.unregister_pre_hook(HOOK_ID)
                group.unregister_post_hook(HOOK_ID)
            except Exception:  # noqa: BLE001
                log.debug("removing the p2p hooks of a group failed", exc_info=True)
        with self._lock:
            self._pending.clear()

    # ------------------------------------------------------------------ any thread
    def in_flight(self) -> list[P2PInFlight]:
        """The sends and recvs issued and not completed, oldest first."""
        with self._lock:
            self._prune()
            return sorted((p.op for p in self._pending.values()), key=lambda op: op.started)

    def to_dicts(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [op.to_dict(now) for op in self.in_flight()[:MAX_LISTED]]

    # ------------------------------------------------------------------ internals
    def _attach_new(self) -> int:
        from lightning_ncclx.backend import torch_api

        groups = torch_api.live_groups()
        if not groups:
            return 0
        if len(groups) == self._known_groups:  # per batch: nothing else when nothing changed
            return len(self._hooked)
        names = torch_api.process_group_hook_op_names()
        if names is None:  # torch < 2.15: no process-group hooks
            self._known_groups = len(groups)
            return 0
        p2p_names = frozenset({names.SEND, names.RECV})
        for group in groups:
            key = id(group)
            if key in self._hooked and self._hooked[key][0]() is group:
                continue
            if not hasattr(group, "register_pre_hook") or not torch_api.served_by(group, "gloo"):
                continue
            members = torch_api.global_ranks_of(group)
            hooks = _GroupHooks(self, torch_api.group_name(group), group.rank(),
                                lambda group_rank, members=members: int(members.get(group_rank, -1)), p2p_names)
            group.register_pre_hook(HOOK_ID, hooks.pre)
            group.register_post_hook(HOOK_ID, hooks.post)
            self._hooked[key] = (weakref.ref(group), hooks)
        self._known_groups = len(groups)
        return len(self._hooked)

    def _add(self, op: P2PInFlight) -> None:
        with self._lock:
            self._prune()
            if len(self._pending) >= MAX_IN_FLIGHT:
                self._pending.pop(min(self._pending, key=lambda k: self._pending[k].op.started))
            self._pending[(op.group, op.op_id)] = _Pending(op)

    def _set_work(self, group: str, op_id: int, work: Any) -> None:
        with self._lock:
            pending = self._pending.get((group, op_id))
            if pending is not None:
                pending.work = work

    def _prune(self) -> None:
        """Caller holds the lock. A record whose Work says completed goes (a record still waiting
        for its Work, between the two hooks, stays)."""
        done = []
        for key, pending in self._pending.items():
            try:
                if pending.work is not None and pending.work.is_completed():
                    done.append(key)
            except Exception:  # noqa: BLE001 - a Work that cannot answer is treated as done
                done.append(key)
        for key in done:
            del self._pending[key]

    def _note_failure(self) -> None:
        self._failures += 1
        if self._failures in (1, 100) or self._failures % 10000 == 0:
            log.warning("recording a point-to-point op failed (%d time(s))", self._failures, exc_info=True)


TRACKER = P2PTracker()
"""This process's tracker (the recorder is per process too); the watchdog attaches and detaches it."""


def p2p_in_flight() -> list[dict[str, Any]]:
    """context.json's ``p2p_in_flight``: [] when nothing is tracked."""
    return TRACKER.to_dicts() if TRACKER.active else []
