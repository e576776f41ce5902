"""The sinks against a real HTTP server in another process: what each posts, and that a failed
attempt's message never holds the secret."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from alerts.servers import alert_server, refused_url
from lightning_ncclx.alerts.message import dedup_key, resolve_document, straggler_document, trigger_document
from lightning_ncclx.alerts.sinks import CommandSink, DeliveryError, PagerDutySink, WebhookSink, pagerduty_body

SECRET = "s3cret-T0KEN-77"
DOCUMENT = {"action": "trigger", "dedup_key": "lightning-ncclx/run/ab12/stall-001", "text": "headline\nmore",
            "event": "stall-001", "kind": "rank_lost", "run_id": "run", "source_host": "node-a"}


def test_webhook_posts_the_document_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with alert_server(tmp_path) as server:
        monkeypatch.setenv("HOOK_URL", server.url(f"/hook/{SECRET}"))
        WebhookSink("HOOK_URL").deliver(DOCUMENT, tmp_path / "a.json", 5.0)
        (post,) = server.posts()
    assert post["body"] == DOCUMENT and post["content_type"] == "application/json"


def test_pagerduty_trigger_and_resolve_share_the_dedup_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PD_KEY", SECRET)
    with alert_server(tmp_path) as server:
        sink = PagerDutySink("PD_KEY", server.url("/v2/enqueue"), "error")
        sink.deliver(DOCUMENT, tmp_path / "a.json", 5.0)
        sink.deliver({"action": "resolve", "dedup_key": DOCUMENT["dedup_key"]}, tmp_path / "b.json", 5.0)
        trigger, resolve = (row["body"] for row in server.posts("/v2/enqueue"))
    assert trigger["routing_key"] == SECRET and trigger["event_action"] == "trigger"
    assert trigger["payload"]["summary"] == "headline" and trigger["payload"]["severity"] == "error"
    assert trigger["payload"]["source"] == "node-a" and trigger["payload"]["class"] == "rank_lost"
    assert resolve == {"routing_key": SECRET, "event_action": "resolve", "dedup_key": DOCUMENT["dedup_key"]}


def test_pagerduty_summary_is_cut_to_the_api_limit() -> None:
    body = pagerduty_body(dict(DOCUMENT, text="x" * 5000), "key", "critical")
    assert len(body["payload"]["summary"]) == 1024


@pytest.mark.parametrize("mode", ["error", "hang", "refused"])
def test_a_dead_endpoint_fails_the_attempt_without_the_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              mode: str) -> None:
    with alert_server(tmp_path, "hang" if mode == "hang" else "error") as server:
        url = refused_url(f"/hook/{SECRET}") if mode == "refused" else server.url(f"/hook/{SECRET}")
        monkeypatch.setenv("HOOK_URL", url)
        with pytest.raises(DeliveryError) as failure:
            WebhookSink("HOOK_URL").deliver(DOCUMENT, tmp_path / "a.json", 1.0)
    assert SECRET not in str(failure.value)
    assert {"error": "HTTP 500", "hang": "timed out", "refused": "not reached"}[mode] in str(failure.value)


@pytest.mark.parametrize("url", [f"ftp://host/{SECRET}", f"http://[bad-host/{SECRET}", f"{SECRET}"])
def test_a_malformed_url_is_refused_without_echoing_it(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("HOOK_URL", url)
    with pytest.raises(DeliveryError) as failure:
        WebhookSink("HOOK_URL").deliver(DOCUMENT, Path("a.json"), 1.0)
    assert SECRET not in str(failure.value)


def test_an_unset_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_HOOK_URL", raising=False)
    with pytest.raises(DeliveryError, match="NO_SUCH_HOOK_URL is not set"):
        WebhookSink("NO_SUCH_HOOK_URL").deliver(DOCUMENT, Path("a.json"), 1.0)


def test_the_command_gets_the_alert_file_and_its_failures_are_named(tmp_path: Path) -> None:
    alert = tmp_path / "alert-trigger.json"
    alert.write_text("{}")
    out = tmp_path / "seen"
    CommandSink(f'{sys.executable} -c "import sys, shutil; shutil.copy(sys.argv[2], sys.argv[1])" {out}').deliver(
        DOCUMENT, alert, 10.0)
    assert out.read_text() == "{}"  # the alert file's path came last
    with pytest.raises(DeliveryError, match="exited with 1"):
        CommandSink("false").deliver(DOCUMENT, alert, 10.0)
    with pytest.raises(DeliveryError, match="ran past"):
        CommandSink(f"{sys.executable} -c 'import time; time.sleep(30)'").deliver(DOCUMENT, alert, 0.5)
    with pytest.raises(DeliveryError, match="could not run"):
        CommandSink(str(tmp_path / "missing-hook")).deliver(DOCUMENT, alert, 1.0)


def test_the_webhook_names_each_alert_with_an_event_scoped_idempotency_key(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeat of one alert (a takeover or resend after the receipt went unrecorded) carries the same
    key; the resolve of that event, and another event, carry others."""
    folder = tmp_path / "run-1" / "stall-001"
    folder.mkdir(parents=True)
    key = dedup_key(folder, {}, "stall-001")
    trigger = trigger_document(folder, {}, event="stall-001", reason="stall", exit_code=None, dedup_key=key,
                               environ={})
    other = trigger_document(folder.parent / "stall-002", {}, event="stall-002", reason="stall", exit_code=None,
                             dedup_key=dedup_key(folder.parent / "stall-002", {}, "stall-002"), environ={})
    with alert_server(tmp_path) as server:
        monkeypatch.setenv("HOOK_URL", server.url(f"/hook/{SECRET}"))
        sink = WebhookSink("HOOK_URL")
        for document in (trigger, dict(trigger), resolve_document(trigger, 3.0), other, DOCUMENT):
            sink.deliver(document, tmp_path / "a.json", 5.0)
        posts = server.posts()
    keys = [post["idempotency_key"] for post in posts]
    assert keys[0] == keys[1] == posts[0]["body"]["alert_id"] == f"{key}/trigger"
    assert keys[2] == posts[2]["body"]["alert_id"] == f"{key}/resolve"
    assert keys[3] not in keys[:3] and keys[3].endswith("stall-002/trigger")
    assert keys[4] == f"{DOCUMENT['dedup_key']}/trigger"  # an alert file written before the field


def test_each_straggler_episode_has_its_own_alert_id(tmp_path: Path) -> None:
    first, again = (straggler_document(tmp_path, {"rank": 2, "opened_interval": i}, environ={}) for i in (4, 9))
    assert first["dedup_key"] == again["dedup_key"] and first["alert_id"] != again["alert_id"]


def test_an_alert_file_whose_id_holds_a_line_break_is_still_delivered(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``alerts resend`` reads files anyone in the folder could write: a CR/LF or non-ASCII id must not
    make the header invalid (urllib refuses it, and the alert would never be sent)."""
    document = dict(DOCUMENT, alert_id="x\r\nInjected: 1\u00e9")
    with alert_server(tmp_path) as server:
        monkeypatch.setenv("HOOK_URL", server.url(f"/hook/{SECRET}"))
        WebhookSink("HOOK_URL").deliver(document, tmp_path / "a.json", 5.0)
        posts = server.posts()
    assert [post["idempotency_key"] for post in posts] == ["x??Injected: 1?"]
