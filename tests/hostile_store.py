"""A hostile client of a running job's ``TCPStore``: what anyone who reaches MASTER_PORT can do.

The store has no authentication: a client that connects (``is_master=False``) can list, read,
write and delete every key of the job. Tests use this client, from the test process (a thread)
while the job runs in its own processes, to plant crafted values (:mod:`hostile_payloads`) at
chosen moments and then check what the ranks did (:mod:`hostile_checks`). It knows nothing of
the plugin's protocol: key names are parameters, relative to a prefix.

Where the plugin's keys live on the server: under ``lightning_ncclx/`` at its root (the plugin
opens its own connections, ``lightning_ncclx.events.connection``, and a ``PrefixStore`` joins
its prefix and the key with ``/``): the plugin's ``ev/1/meta`` is the server's
``lightning_ncclx/ev/1/meta`` (listed on a running 2-rank job in ``tests/test_hostile_store.py``).
torch's own keys of the default group are ``default_pg/0//cpu//0/<rank>``.

Example::

    hostile = HostileStore.of_job(env)                      # MASTER_ADDR / MASTER_PORT
    hostile.wait_for(lambda names: "ev/1/meta" in names, 60)
    hostile.set("ev/1/rank/1", '{"host": "..", "files": [], "folder": "/"}')
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Mapping

JOB_STORE_PREFIX = "default_pg/0//"
"""What torch puts before every key made through the default group's store."""
PLUGIN_PREFIX = "lightning_ncclx/"
"""What the plugin's keys start with on the server."""
STORE_VALUE_LIMIT_BYTES = 8 * 1024 * 1024
"""torch's libuv server refuses a larger value and closes that client's connection."""


class HostileStore:
    """One connection to the job's store, keys relative to ``prefix`` (``""``: the raw server)."""

    def __init__(self, host: str, port: int, *, prefix: str = PLUGIN_PREFIX, timeout_seconds: float = 5.0) -> None:
        self.host = host
        self.port = int(port)
        self.prefix = prefix
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._store = self._connect()

    @classmethod
    def of_job(cls, env: Mapping[str, str], **kwargs: Any) -> "HostileStore":
        """The store of a job started with this environment (``MASTER_ADDR``, ``MASTER_PORT``)."""
        return cls(env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]), **kwargs)

    def _connect(self) -> Any:
        import torch.distributed as dist

        wait_until_listening(self.host, self.port, self.timeout_seconds)
        return dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=self.timeout_seconds))

    def reconnect(self) -> None:
        """A new connection (the server closes one after a value over its limit)."""
        with self._lock:
            self._store = self._connect()

    def full_key(self, name: str) -> str:
        return self.prefix + name

    # ------------------------------------------------------------------ what any client can do
    def set(self, name: str, value: bytes | str) -> None:
        with self._lock:
            self._store.set(self.full_key(name), value)
            self._applied(name)

    def try_set(self, name: str, value: bytes | str) -> bool:
        """False (and a new connection) where the server refused the value, e.g. one over its limit."""
        try:
            self.set(name, value)
        except Exception:  # noqa: BLE001 - DistNetworkError: the server closed the connection
            self.reconnect()
            return False
        return True

    def get(self, name: str) -> bytes | None:
        """The value, None when absent (``check`` first: ``get`` would block until it exists)."""
        with self._lock:
            key = self.full_key(name)
            return self._store.get(key) if self._store.check([key]) else None

    def exists(self, name: str) -> bool:
        with self._lock:
            return bool(self._store.check([self.full_key(name)]))

    def delete(self, name: str) -> bool:
        with self._lock:
            return bool(self._store.delete_key(self.full_key(name)))

    def add(self, name: str, amount: int) -> int:
        with self._lock:
            return int(self._store.add(self.full_key(name), amount))

    def append(self, name: str, value: bytes | str) -> None:
        with self._lock:
            self._store.append(self.full_key(name), value)
            self._applied(name)

    def _applied(self, name: str) -> None:
        """TCPStore's ``set`` and ``append`` send without waiting for a reply: a read on another
        connection right after could reach the server first. A round trip on this connection
        returns only once the server has applied every request sent before it."""
        self._store.check([self.full_key(name)])

    def names(self, under: str = "") -> list[str]:
        """Every key under ``prefix + under``, relative to ``prefix``, sorted."""
        with self._lock:
            keys = self._store.list_keys()
        start = self.full_key(under)
        return sorted(key[len(self.prefix):] for key in keys if key.startswith(start))

    # ------------------------------------------------------------------ at given moments
    def wait_for(self, condition: str | Callable[[list[str]], bool], timeout_seconds: float,
                 poll_seconds: float = 0.02) -> bool:
        """Until a key exists (a name) or ``condition(names())`` holds; False after the timeout."""
        test = condition if callable(condition) else (lambda names: condition in names)
        deadline = time.monotonic() + timeout_seconds
        while not test(self.names()):
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_seconds)
        return True

    def when(self, condition: str | Callable[[list[str]], bool], action: Callable[["HostileStore"], Any],
             timeout_seconds: float) -> "Background":
        """In a thread: wait for ``condition`` (as :meth:`wait_for`), then run ``action(self)``."""
        def run() -> Any:
            if not self.wait_for(condition, timeout_seconds):
                raise TimeoutError(f"{condition!r} did not happen within {timeout_seconds} s")
            return action(self)

        return Background(run)

    def close(self) -> None:
        with self._lock:
            self._store = None

    def __enter__(self) -> "HostileStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Background:
    """``target()`` in a daemon thread; :meth:`result` joins it and re-raises what it raised."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(target,), name="hostile-store", daemon=True)
        self._thread.start()

    def _run(self, target: Callable[[], Any]) -> None:
        try:
            self._value = target()
        except BaseException as error:  # noqa: BLE001 - handed to result()
            self._error = error

    def result(self, timeout_seconds: float) -> Any:
        self._thread.join(timeout_seconds)
        if self._thread.is_alive():
            raise TimeoutError(f"the hostile action still runs after {timeout_seconds} s")
        if self._error is not None:
            raise self._error
        return self._value


def wait_until_listening(host: str, port: int, timeout_seconds: float, poll_seconds: float = 0.05) -> None:
    """Until something accepts on ``host:port`` (a TCPStore client that connects too early logs
    a C++ stack per try); raises TimeoutError."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=poll_seconds * 10):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_seconds} s") from None
            time.sleep(poll_seconds)
