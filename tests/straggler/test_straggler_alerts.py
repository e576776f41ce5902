"""Straggler warnings as alerts: real 4-rank Lightning fits (gloo on CPU) where ranks 1 and 2
are slow send their warnings to a real HTTP server in another process, as lower-severity
alerts, at most one per ``straggler_min_interval_seconds`` for the whole job. Outcomes only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alerts.servers import alert_server
from straggler.harness import run_job

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(("min_interval", "expected"), [(3600.0, 1), (0.0, 2)])
def test_two_slow_ranks_send_the_rate_limited_number_of_warnings(tmp_path: Path, min_interval: float,
                                                                 expected: int) -> None:
    with alert_server(tmp_path / "server") as server:
        alerts = {"enabled": True, "stragglers": True, "straggler_min_interval_seconds": min_interval,
                  "webhook": {"url_env": "NCCLX_TEST_WEBHOOK_URL"},
                  "pagerduty": {"routing_key_env": "NCCLX_TEST_ROUTING_KEY", "endpoint": server.url("/pd")}}
        result = run_job(tmp_path, "--fault", "slow_compute", "--fault-rank", "1,2", "--slow-fraction", "0.5",
                         "--attach", "strategy",
                         extra_env={"NCCLX_TEST_ALERTS": json.dumps(alerts), "NCCLX_TEST_ROUTING_KEY": "key-1",
                                    "NCCLX_TEST_WEBHOOK_URL": server.url("/hook")})
        hooks, pds = server.posts("/hook"), server.posts("/pd")
    assert result.returncode == 0, result.log[-4000:]
    episodes = result.stragglers()["episodes"]
    assert sorted(e["rank"] for e in episodes) == [1, 2], episodes
    assert len(hooks) == expected and len(pds) == expected, (hooks, pds, result.log[-4000:])
    bodies = [row["body"] for row in hooks]
    assert all(b["reason"] == "straggler" and "straggler" in b["text"] and b["severity"] == "warning"
               for b in bodies), bodies
    named = [b["culprit_ranks"][0] for b in bodies]
    assert len(set(named)) == expected and set(named) <= {1, 2}, named
    assert all(row["body"]["payload"]["severity"] == "warning" for row in pds), pds
    assert len(list(result.root.rglob("alert-straggler-*.json"))) == expected
