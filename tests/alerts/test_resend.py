"""``lightning-ncclx alerts resend``: sends only what was not delivered; bad input gets a message
and exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from alerts.servers import alert_server
from lightning_ncclx.alerts.outbox import read_alert, write_alert
from lightning_ncclx.cli import main

DOCUMENT = {"action": "trigger", "dedup_key": "k", "text": "t", "event": "stall-001"}


def test_resend_delivers_to_the_failed_sinks_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run" / "stall-001"
    folder.mkdir(parents=True)
    path = folder / "alert-trigger.json"
    with alert_server(tmp_path / "srv") as server:
        monkeypatch.setenv("HOOK_URL", server.url("/hook"))
        monkeypatch.setenv("PD_KEY", "key")
        write_alert(path, DOCUMENT, {
            "webhook": {"settings": {"url_env": "HOOK_URL"}, "state": "sent"},
            "pagerduty": {"settings": {"routing_key_env": "PD_KEY", "endpoint": server.url("/pd")},
                          "state": "failed", "error": "HTTP 500"}})
        assert main(["alerts", "resend", str(tmp_path / "run")]) == 0
        assert [row["path"] for row in server.posts()] == ["/pd"]
    assert read_alert(path)[1]["pagerduty"]["state"] == "sent"
    assert "trigger -> pagerduty: delivered" in capsys.readouterr().out


def test_resend_that_fails_again_exits_1_and_keeps_the_alert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "alert-resolve.json"
    monkeypatch.delenv("NO_SUCH_URL_VARIABLE", raising=False)
    write_alert(path, dict(DOCUMENT, action="resolve"),
                {"webhook": {"settings": {"url_env": "NO_SUCH_URL_VARIABLE"}, "state": "failed"}})
    assert main(["alerts", "resend", str(path)]) == 1
    assert "NO_SUCH_URL_VARIABLE is not set" in read_alert(path)[1]["webhook"]["error"]


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file or folder"),
    (b"", "not JSON"),
    (b'{"document": {"action": "trigger"}, "sinks": {"carrier-pigeon": {"settings": {}}}}', "unknown or malformed"),
])
def test_bad_input_gets_a_message_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             content: bytes | None, message: str) -> None:
    path = tmp_path / "alert-trigger.json"
    if content is not None:
        path.write_bytes(content)
    assert main(["alerts", "resend", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_folder_without_alerts_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alerts", "resend", str(tmp_path)]) == 2
    assert "no alert file" in capsys.readouterr().err
