"""Live Prometheus metrics of each rank: what the watchdog knows (seconds since the last
heartbeat, phase, events, dumps, whether it runs), the global step, the last step time and the
straggler scores. :mod:`snapshot` reads them, :mod:`families` turns snapshots into metric
families, :mod:`server` serves ``/metrics``, :mod:`textfile` merges a host's ranks into one
node_exporter file, :mod:`callback` runs them in a Trainer. ``prometheus_client`` (the
``[metrics]`` extra) is imported only when ``ncclx.metrics`` asks for a port or a textfile."""

from lightning_ncclx.metrics.callback import MetricsExporter

__all__ = ["MetricsExporter"]
