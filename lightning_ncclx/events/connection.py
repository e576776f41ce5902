"""The plugin's connections to the job's store, and reads that never block.

Each rank holds at most three connections to the job's store: the job's own (torch's, used by
the main thread), one :class:`StoreClient` shared by the watchdog, the consensus and straggler
detection (:func:`shared_client`), and the doorbell's (:mod:`doorbell`), which blocks in one
``wait``. The plugin's two are opened from their own threads with a short connect timeout, so
``setup`` never waits on the network, and a failed connect is retried later, not for the store's
30-minute timeout.

Keys live under ``lightning_ncclx/`` at the root of the store server (``lightning_ncclx/attempt<N>/``
under torchrun's restart ``N``), not under torch's ``default_pg`` prefix: torch offers no way to
open a connection under that prefix without the job store's long timeout.

:meth:`StoreClient.read` never blocks: ``compare_set(key, S, S)`` with a secret ``S`` returns
the value when the key exists and ``S`` (creating nothing) when it does not. ``get`` would wait
for the key, and ``check`` then ``get`` races with a rank that deletes it. Every call runs under
an operation timeout no longer than the watchdog's poll interval; a lost connection is reopened
(at most once per ``RECONNECT_GAP_SECONDS``).

torch's TCPStore client (2.15) ignores its timeout on a peer that accepted the connection and
never answers (a frozen or powered-off host: the kernel gives up only after ~15 minutes of
retransmits), both in a request and in the constructor's handshake. So each connection the
client opens itself runs its requests on a thread of its own (:class:`_Lane`), and the caller
waits at most :attr:`StoreClient.deadline_seconds`: past it the connection is given up
(:class:`StoreUnanswered`), its thread left to end with the connection, and the next request
opens a new one. At most ``MAX_UNANSWERED_LANES`` such threads are left at once; past that no new
connection is tried until one of them ends.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

from lightning_ncclx.events.keys import STORE_PREFIX

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 10.0
RECONNECT_GAP_SECONDS = 5.0
READ_CHUNK = 256
"""Keys per ``multi_get`` (about 256 KiB of digests): one answer arrives well within a poll."""
DELETE_CHUNK = 512
REQUEST_DEADLINE_FLOOR_SECONDS = 5.0
"""The least a caller waits for one request before the connection counts as unanswered: a loaded
but healthy store answers far sooner."""
MAX_UNANSWERED_LANES = 4
STARVED_SECONDS = 1.0
"""A caller that wakes this much past its deadline was starved of the CPU or the GIL."""


class StoreUnavailable(RuntimeError):
    """No connection to the job's store now (it is retried at the next call)."""


class StoreUnanswered(StoreUnavailable):
    """The store accepted a request (or a connection) and answered nothing within the deadline:
    its host is frozen, powered off or cut off. The connection is given up."""


class StoreServerGone(StoreUnavailable):
    """Nothing listens at the store's address any more (the connection was refused): the process
    that served it is gone, and no value written there can be read again."""


@dataclass(frozen=True)
class StoreAddress:
    """Where the job's TCPStore server listens, and the plugin's key namespace on it."""

    host: str
    port: int
    namespace: str = STORE_PREFIX

    @classmethod
    def of(cls, job_store: Any, environ: dict[str, str] | None = None) -> "StoreAddress | None":
        """The address behind ``job_store`` (PrefixStores unwrapped); None where it is no TCPStore."""
        import torch.distributed as dist

        base = job_store
        while isinstance(base, dist.PrefixStore):
            base = base.underlying_store
        if not isinstance(base, dist.TCPStore):
            return None
        return cls(str(base.host), int(base.port), namespace_from(os.environ if environ is None else environ))

    def connect(self, connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS) -> Any:
        """A new client under the plugin's namespace (raises on failure after the timeout, at
        once where nothing listens at the address any more: see :func:`refused`)."""
        import torch.distributed as dist

        if refused(self.host, self.port, connect_timeout_seconds):
            raise StoreServerGone(f"nothing listens at {self.host}:{self.port} any more (connection refused): "
                                  "the store's host process is gone")
        client = dist.TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=connect_timeout_seconds))
        return dist.PrefixStore(self.namespace, client)


def refused(host: str, port: int, timeout_seconds: float) -> bool:
    """Whether a plain TCP connection to the store is refused (its host answered, nothing
    listens: the process that served it is gone). The TCPStore client retries a refused
    connection until its whole timeout, holding the calling thread (the watchdog's) each time;
    a refusal needs no waiting. Anything else (accepted, unanswered, unresolvable) is left to the
    TCPStore client."""
    try:
        with socket.create_connection((host, port), timeout=max(0.05, min(timeout_seconds, 2.0))):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def address_is_local(host: str) -> bool:
    """Whether ``host`` (the store's address) names this machine: a socket can be bound to it
    only here. Loopback names every machine, as a one-host job's store address does."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, kind, _, _, address in infos:
        try:
            with socket.socket(family, kind) as probe:
                probe.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def namespace_from(environ: dict[str, str] | Any) -> str:
    """``lightning_ncclx``, or ``lightning_ncclx/attempt<N>`` under torchrun's restart ``N`` (a
    restart's ranks share the agent's store with the attempts before)."""
    attempt = str(environ.get("TORCHELASTIC_RESTART_COUNT", "") or "")
    if re.fullmatch(r"[0-9]{1,6}", attempt) and attempt != "0":
        return f"{STORE_PREFIX}/attempt{int(attempt)}"
    return STORE_PREFIX


def _is_connection_error(error: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(error, dist.DistNetworkError):
        return True
    text = str(error).lower()
    return isinstance(error, (RuntimeError, OSError)) and any(
        word in text for word in ("broken pipe", "connection reset", "connection closed", "connection refused"))


def _is_timeout(error: BaseException) -> bool:
    import torch.distributed as dist

    return isinstance(error, dist.DistStoreError) and "timeout" in str(error).lower()


class _Lane:
    """One connection's requests, run in order on a thread of its own so that each caller waits
    at most a deadline (see the module's docstring)."""

    def __init__(self, name: str) -> None:
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._changed = threading.Condition()
        self.abandoned = False
        self.closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run(self, fn: Callable[[], Any], deadline_seconds: float, what: str) -> Any:
        """``fn()`` on this lane's thread; :class:`StoreUnanswered` once it has run for
        ``deadline_seconds`` without returning. The deadline counts from when the lane started it
        (a request queued behind another waits for that one's deadline first), and a caller that
        itself woke more than ``STARVED_SECONDS`` late grants another deadline: its process was
        starved (the main thread holding the GIL, the CPU overloaded), which says nothing of the
        store."""
        request = _Request(fn)
        with self._changed:
            if self.abandoned:
                raise StoreUnanswered(f"the store connection was given up: {what} was not sent")
            if self.closed:
                raise _LaneClosed("the store connection was replaced")
            self._requests.put(request)
            due = time.monotonic() + deadline_seconds
            while not (request.done or self.abandoned):
                if request.started is not None:
                    due = max(due, request.started + deadline_seconds)
                now = time.monotonic()
                if now < due:
                    self._changed.wait(due - now)
                    woke = time.monotonic()
                    if woke - due > STARVED_SECONDS and not (request.done or self.abandoned):
                        due = woke + deadline_seconds
                    continue
                self._abandon_locked()
                raise StoreUnanswered(f"the store answered nothing to {what} within {deadline_seconds:.0f} s; "
                                      "the connection is given up")
            if not request.done:
                raise StoreUnanswered(f"the store connection was given up while {what} waited")
        if request.error is not None:
            raise request.error
        return request.value

    def close(self) -> None:
        """End the thread once the requests before now are answered; later ones are refused."""
        with self._changed:
            if not self.closed:
                self.closed = True
                self._requests.put(None)

    def _abandon_locked(self) -> None:
        if not self.abandoned:
            self.abandoned = True
            self._requests.put(None)
            self._changed.notify_all()

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            if not self.abandoned:
                self._answer(request)
            del request  # holds the connection until the next request otherwise

    def _answer(self, request: _Request) -> None:
        request.started = time.monotonic()
        try:
            request.value = request.fn()
        except BaseException as error:  # noqa: BLE001 - handed to the caller, raised there
            request.error = error
        with self._changed:
            request.done = True
            self._changed.notify_all()
        if self.abandoned and request.error is not None:
            log.debug("a store request given up earlier ended: %s: %s", type(request.error).__name__, request.error)


class _LaneClosed(StoreUnavailable):
    """A request came after its connection was replaced: it is sent on the new one."""


class _Request:
    __slots__ = ("fn", "value", "error", "done", "started")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.started: float | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = False


class StoreClient:
    """One connection to the job's store with non-blocking reads, timeouts and reconnection.

    ``opener`` makes a new connection (None: ``store`` is the only one, e.g. an in-process
    HashStore in tests). ``owned=False``: ``store`` is shared with the job (a FileStore), so its
    timeout is left alone and nothing waits on it. Thread-safe: the store client serializes
    requests; reconnection is locked. ``bounded=False``: the connections it opens are called
    directly, without the deadline (for simulations that pack thousands of ranks into one process,
    where that many request threads would contend for one GIL as no real rank does)."""

    def __init__(self, store: Any = None, *, opener: Callable[[], Any] | None = None,
                 op_timeout_seconds: float = 0.5, owned: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 connect_deadline_seconds: float | None = None, bounded: bool = True) -> None:
        if store is None and opener is None:
            raise ValueError("StoreClient needs a store or an opener")
        self._store = store
        self._opener = opener
        self._op_timeout = timedelta(seconds=max(0.05, op_timeout_seconds))
        self._sentinel = "\x00" + secrets.token_urlsafe(12)  # 96 random bits: sent twice per read, so short
        self._sentinel_bytes = self._sentinel.encode()
        self._lock = threading.Lock()
        self._clock = clock
        self._next_attempt = 0.0
        self._quiet_until = 0.0
        self._failures = 0
        self.server_gone = False
        """The last attempt to connect was refused (:class:`StoreServerGone`); a later success clears it."""
        self.reconnects = 0
        self.owned = owned
        self._closed = False
        self._lane: _Lane | None = None
        self._given_up: list[_Lane] = []
        self.deadline_seconds = max(REQUEST_DEADLINE_FLOOR_SECONDS, 4 * op_timeout_seconds)
        """How long a caller waits for one request on a connection this client opened itself."""
        self._bounded = bounded
        self.connect_deadline_seconds = (CONNECT_TIMEOUT_SECONDS + self.deadline_seconds
                                         if connect_deadline_seconds is None else connect_deadline_seconds)
        if store is not None and owned:
            self._apply_timeout(store)

    # ------------------------------------------------------------------ connection
    def _apply_timeout(self, store: Any) -> None:
        try:
            store.set_timeout(self._op_timeout)
        except Exception:  # noqa: BLE001 - a store without timeouts (HashStore) never blocks long
            log.debug("set_timeout not supported by %s", type(store).__name__, exc_info=True)

    def _current(self) -> tuple[Any, _Lane | None]:
        store, lane = self._store, self._lane
        if store is not None:
            return store, lane
        return self._reopen(None)

    @property
    def closed(self) -> bool:
        """:meth:`close` was called: every request now fails without asking the store."""
        return self._closed

    def close(self) -> None:
        """Drop this client's connection now, not whenever the garbage collector frees it; a
        later request raises :class:`StoreUnavailable`."""
        with self._lock:
            self._closed = True
            self._store = None
            if self._lane is not None:
                self._lane.close()
                self._lane = None

    def __del__(self) -> None:
        lane = getattr(self, "_lane", None)
        if lane is not None:
            lane.close()

    def _reopen(self, broken: Any) -> tuple[Any, _Lane | None]:
        with self._lock:
            if self._closed:
                raise StoreUnavailable("this store client was closed")
            if self._store is not broken and self._store is not None:
                return self._store, self._lane  # another thread reconnected meanwhile
            if self._opener is None:
                raise StoreUnavailable("the store connection was lost and cannot be reopened")
            now = self._clock()
            down = StoreServerGone if self.server_gone else StoreUnavailable
            if now < self._next_attempt:
                raise down("the store connection is down; the next attempt is in "
                           f"{self._next_attempt - now:.1f} s")
            self._given_up = [lane for lane in self._given_up if lane.alive]
            if len(self._given_up) >= MAX_UNANSWERED_LANES:
                raise StoreUnanswered(f"{len(self._given_up)} connections to the store are still waiting for "
                                      "an answer; no new one until one of them ends")
            if broken is not None and now < self._quiet_until:
                # lost again soon after a reconnect: wait before the next one (no reconnect storm)
                self._next_attempt = now + RECONNECT_GAP_SECONDS
                self._drop_locked()
                raise down(f"the store connection was lost again within {RECONNECT_GAP_SECONDS:.0f} s "
                           "of the last reconnect")
            self._drop_locked()
            lane = _Lane("ncclx-store") if self._bounded else None
            try:
                store = self._opener() if lane is None else lane.run(self._opener, self.connect_deadline_seconds,
                                                                     "the connection")
            except Exception as error:  # noqa: BLE001
                if lane is not None:
                    self._retire(lane)
                self._failures += 1
                self._next_attempt = now + min(60.0, RECONNECT_GAP_SECONDS * 2 ** min(self._failures - 1, 4))
                self.server_gone = isinstance(error, StoreServerGone)
                raise (StoreServerGone if self.server_gone else StoreUnavailable)(
                    f"connecting to the job's store failed: {type(error).__name__}: "
                    f"{str(error).splitlines()[0][:160] if str(error) else ''}") from None
            self._apply_timeout(store)
            self.server_gone = False
            if broken is not None:
                self.reconnects += 1
                log.info("reconnected to the job's store (%d time(s) in this run)", self.reconnects)
            self._failures = 0
            if broken is not None:
                self._quiet_until = now + RECONNECT_GAP_SECONDS
            self._store, self._lane = store, lane
            return store, lane

    def _drop_locked(self) -> None:
        if self._lane is not None:
            self._retire(self._lane)
        self._store, self._lane = None, None

    def _retire(self, lane: _Lane) -> None:
        if lane.abandoned:
            self._given_up.append(lane)
        else:
            lane.close()

    def _give_up(self, store: Any) -> None:
        """``store``'s connection answered nothing in time: the next request opens a new one."""
        with self._lock:
            if self._store is store:
                self._drop_locked()

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        store, lane = self._current()
        try:
            return self._send(store, lane, fn)
        except StoreUnanswered:
            self._give_up(store)
            raise
        except _LaneClosed:
            pass
        except Exception as error:  # noqa: BLE001
            if not _is_connection_error(error) or self._opener is None:
                raise
        store, lane = self._reopen(store)
        try:
            return self._send(store, lane, fn)
        except StoreUnanswered:
            self._give_up(store)
            raise

    @property
    def raw(self) -> Any:
        """The underlying store (opened now if needed), for calls this class does not wrap (not
        bounded by the deadline)."""
        return self._current()[0]

    def _send(self, store: Any, lane: _Lane | None, fn: Callable[[Any], Any]) -> Any:
        if lane is None:
            return fn(store)
        return lane.run(lambda: fn(store), self.deadline_seconds, "a request")

    # ------------------------------------------------------------------ requests
    def read(self, key: str) -> bytes | None:
        """The value of ``key``, or None when it does not exist; never waits for it."""
        value = self._call(lambda s: s.compare_set(key, self._sentinel, self._sentinel))
        return None if value == self._sentinel_bytes else bytes(value)

    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values of ``keys`` (None where absent), ``READ_CHUNK`` per ``multi_get``; a chunk whose
        keys are not all there (deleted meanwhile) is read key by key instead of waited for."""
        if not self.owned:
            return [self.read(key) for key in keys]
        out: list[bytes | None] = []
        for first in range(0, len(keys), READ_CHUNK):
            chunk = list(keys[first:first + READ_CHUNK])
            try:
                out += [bytes(v) for v in self._call(lambda s: s.multi_get(chunk))]
            except Exception as error:  # noqa: BLE001
                if not _is_timeout(error):
                    raise
                out += [self.read(key) for key in chunk]
        return out

    def set(self, key: str, value: bytes | str) -> None:
        self._call(lambda s: s.set(key, value))

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        self._call(lambda s: s.multi_set(keys, values))

    def add(self, key: str, amount: int) -> int:
        return int(self._call(lambda s: s.add(key, amount)))

    def append(self, key: str, value: bytes | str) -> None:
        self._call(lambda s: s.append(key, value))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return bytes(self._call(lambda s: s.compare_set(key, expected, desired)))

    def check(self, keys: list[str]) -> bool:
        return bool(self._call(lambda s: s.check(keys)))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Store-like: ``read_many`` with ``b""`` for a key that is absent (never waits for it)."""
        return [value if value is not None else b"" for value in self.read_many(keys)]

    def get(self, key: str) -> bytes:
        """Store-like, but never waits: ``b""`` for an absent key."""
        return self.read(key) or b""

    def delete_key(self, key: str) -> bool:
        return self.delete([key]) == 1

    def set_timeout(self, timeout: timedelta) -> None:
        """Ignored: this client's requests keep their own short timeout."""

    def delete(self, keys: Sequence[str]) -> int:
        """Delete ``keys`` (one request each: the store has no batched delete; ``DELETE_CHUNK`` of
        them per hand-over to the connection's thread); how many went."""
        deleted = 0
        for first in range(0, len(keys), DELETE_CHUNK):
            chunk = list(keys[first:first + DELETE_CHUNK])
            deleted += int(self._call(lambda s: _delete_each(s, chunk)))
        return deleted


def _delete_each(store: Any, keys: Sequence[str]) -> int:
    deleted = 0
    for key in keys:
        try:
            if store.delete_key(key):
                deleted += 1
        except Exception as error:  # noqa: BLE001 - a store without delete_key keeps the key
            if _is_connection_error(error):
                raise
            log.debug("deleting store key %s failed", key, exc_info=True)
    return deleted


# ---------------------------------------------------------------------- the shared connection
_shared: dict[StoreAddress, tuple[StoreClient, int]] = {}
_shared_lock = threading.Lock()


def shared_client(job_store: Any, op_timeout_seconds: float) -> StoreClient:
    """The process's one plugin connection to ``job_store``'s server (opened lazily, from the
    first thread that uses it). Pair every call with :func:`release_client`.

    A store without a server (``HashStore``: a run without a process group) gets a client of its
    own each time: there is no connection to share, and a cache keyed by the object's ``id``
    handed a later store, placed where a freed one had been, the freed one's client and events."""
    address = StoreAddress.of(job_store)
    if address is None:
        return _new_client(job_store, op_timeout_seconds)
    with _shared_lock:
        client, users = _shared.get(address, (None, 0))
        if client is None:
            client = _new_client(job_store, op_timeout_seconds)
        _shared[address] = (client, users + 1)
        return client


def release_client(client: StoreClient) -> None:
    with _shared_lock:
        for key, (held, users) in list(_shared.items()):
            if held is client:
                if users <= 1:
                    del _shared[key]
                    client.close()
                else:
                    _shared[key] = (held, users - 1)
                return


def _new_client(job_store: Any, op_timeout_seconds: float) -> StoreClient:
    address = StoreAddress.of(job_store)
    if address is not None:
        return StoreClient(opener=address.connect, op_timeout_seconds=op_timeout_seconds)
    import torch.distributed as dist

    return StoreClient(dist.PrefixStore(STORE_PREFIX, job_store), op_timeout_seconds=op_timeout_seconds, owned=False)
