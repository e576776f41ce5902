"""A TCP relay in front of a real TCPStore that a test can make lose its host (:meth:`lose`: the
connections end, new ones go unanswered) or freeze it (:meth:`freeze`: connections stay open and
nothing is answered, as a frozen or powered-off host's are until the kernel gives up)."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator

import torch.distributed as dist


class LosableRelay:
    """127.0.0.1:<port> relayed to the store; :meth:`lose` ends it as a lost host would."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.listener.getsockname()[1]
        self.lost = threading.Event()
        self.frozen = threading.Event()
        self.sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        self.listener.settimeout(0.05)
        while not self.lost.is_set():
            try:
                near, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            if self.frozen.is_set():
                with self._lock:
                    self.sockets.append(near)  # accepted, never answered
                continue
            far = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self.sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    return
                if not self.frozen.is_set():
                    sink.sendall(data)
            except OSError:
                return

    def lose(self) -> None:
        """No more relaying; the relayed connections end; a new connection attempt gets no answer
        (the backlog is made full and nothing accepts)."""
        self.lost.set()
        self._accepter.join()
        with self._lock:
            for sock in self.sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        self.listener.listen(0)
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            self.sockets.append(filler)

    def freeze(self) -> None:
        """Nothing more is relayed or answered; connections stay open, new ones are accepted."""
        self.frozen.set()

    def thaw(self) -> None:
        """The frozen connections end (as once the kernel gives up on them); new ones are relayed."""
        with self._lock:
            frozen, self.sockets = self.sockets, []
        for sock in frozen:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.frozen.clear()

    def close(self) -> None:
        self.lost.set()
        for sock in [*self.sockets, self.listener]:
            try:
                sock.close()
            except OSError:
                pass


@contextmanager
def relayed_store() -> Iterator[LosableRelay]:
    """A real TCPStore server in this process, reached only through a relay."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    relay = LosableRelay(server.port)
    try:
        yield relay
    finally:
        relay.close()
        del server
