"""``/metrics`` of one rank, served by prometheus_client on a daemon thread (port = base +
local rank); the registry holds only this rank's collector."""

from __future__ import annotations

import logging
from typing import Any, Callable

from lightning_ncclx.metrics.families import SnapshotCollector

log = logging.getLogger(__name__)


class MetricsServer:
    def __init__(self, address: str, port: int, read: Callable[[], list[dict[str, Any]]]) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(read))
        self.port = port
        self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)

    def stop(self) -> None:
        try:
            self._server.shutdown()
            self._server.server_close()
        except Exception:  # noqa: BLE001
            log.warning("stopping the metrics server on port %d failed", self.port, exc_info=True)
        self._thread.join(timeout=2.0)
