"""Where an alert goes: a JSON webhook, PagerDuty Events API v2, a local command.

Each sink's :meth:`deliver` makes one attempt, bounded by ``timeout`` seconds, and raises
:class:`DeliveryError` with a message that never holds a secret (a webhook URL, a routing key
or anything that contains one is replaced by ``<secret>``)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

USER_AGENT = "lightning-ncclx-alerts/1"
PAGERDUTY_SUMMARY_LIMIT = 1024
SEVERITIES = ("critical", "error", "warning", "info")
"""PagerDuty's; a document that names one (a straggler warning: ``warning``) overrides the sink's."""


class DeliveryError(Exception):
    """One attempt failed; the message is safe to log and to keep in the alert file."""


class Sink(Protocol):
    name: str

    def deliver(self, document: Mapping[str, Any], alert_path: Path, timeout: float) -> None: ...

    def settings(self) -> dict[str, Any]: ...


def _secret(env_name: str) -> str:
    value = os.environ.get(env_name, "")
    if not value:
        raise DeliveryError(f"the environment variable {env_name} is not set (it holds the secret)")
    return value


def scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "<secret>") if secret else text


def alert_id(document: Mapping[str, Any]) -> str:
    """The event-scoped id of one alert: the document's ``alert_id``, else ``<dedup_key>/<action>``
    (alert files written before the field). The same for every attempt, takeover and resend of
    that alert; a trigger and its resolve differ."""
    value = document.get("alert_id")
    if isinstance(value, str) and value:
        return value
    return f"{document.get('dedup_key')}/{document.get('action')}"


def post_json(url: str, body: Mapping[str, Any], timeout: float, secret: str,
              extra_headers: Mapping[str, str] | None = None) -> int:
    """POST ``body`` as JSON; the HTTP status of a 2xx answer, else :class:`DeliveryError`."""
    if not url.startswith(("https://", "http://")):
        raise DeliveryError("the URL is not http(s)")
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    headers.update(extra_headers or {})
    try:
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - http(s) only, checked above
            answer.read(64 * 1024)
            return int(answer.status)
    except urllib.error.HTTPError as err:
        raise DeliveryError(f"HTTP {err.code}") from None
    except urllib.error.URLError as err:
        raise DeliveryError(scrub(f"not reached: {err.reason}", secret)) from None
    except (OSError, ValueError) as err:  # timeouts, resets, a malformed URL
        raise DeliveryError(scrub(f"{type(err).__name__}: {err}", secret)) from None


def _header_value(text: str) -> str:
    """``text`` as a header value urllib accepts: printable ASCII only (an alert file read back by
    ``alerts resend`` may hold anything), at most 512 characters."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:512]


@dataclass
class WebhookSink:
    """Posts the document as is: ``text`` for Slack-like tools, the other fields for the rest; the
    ``Idempotency-Key`` header carries :func:`alert_id` (a receiver drops a repeat of it)."""

    url_env: str
    name: str = "webhook"

    def deliver(self, document: Mapping[str, Any], alert_path: Path, timeout: float) -> None:
        url = _secret(self.url_env)
        key = alert_id(document)
        post_json(url, document, timeout, url, {"Idempotency-Key": _header_value(key)})

    def settings(self) -> dict[str, Any]:
        return {"url_env": self.url_env}


@dataclass
class PagerDutySink:
    """Events API v2: ``trigger`` with the document as custom details; ``resolve`` with the same dedup key."""

    routing_key_env: str
    endpoint: str
    severity: str = "critical"
    name: str = "pagerduty"

    def deliver(self, document: Mapping[str, Any], alert_path: Path, timeout: float) -> None:
        key = _secret(self.routing_key_env)
        post_json(self.endpoint, pagerduty_body(document, key, self.severity), timeout, key)

    def settings(self) -> dict[str, Any]:
        return {"routing_key_env": self.routing_key_env, "endpoint": self.endpoint, "severity": self.severity}


def pagerduty_body(document: Mapping[str, Any], routing_key: str, severity: str) -> dict[str, Any]:
    body: dict[str, Any] = {"routing_key": routing_key, "event_action": document.get("action"),
                            "dedup_key": document.get("dedup_key")}
    if document.get("action") == "trigger":
        body["payload"] = {
            "summary": str(document.get("text", "")).split("\n", 1)[0][:PAGERDUTY_SUMMARY_LIMIT],
            "source": str(document.get("source_host") or "unknown"),
            "severity": document["severity"] if document.get("severity") in SEVERITIES else severity,
            "component": "lightning-ncclx",
            "group": str(document.get("run_id") or ""),
            "class": str(document.get("kind") or ""),
            "custom_details": dict(document),
        }
    return body


@dataclass
class CommandSink:
    """Runs ``command`` (no shell) with the alert file's path appended; exit 0 is delivered."""

    command: str
    name: str = "command"

    def deliver(self, document: Mapping[str, Any], alert_path: Path, timeout: float) -> None:
        try:
            argv = shlex.split(self.command) + [str(alert_path)]
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise DeliveryError(f"the command ran past {timeout:g} s (killed)") from None
        except (OSError, ValueError) as err:
            raise DeliveryError(f"the command could not run: {type(err).__name__}: {err}") from None
        if done.returncode != 0:
            raise DeliveryError(f"the command exited with {done.returncode}")

    def settings(self) -> dict[str, Any]:
        return {"command": self.command}


def sinks_from_settings(settings: Mapping[str, Any]) -> list[Sink]:
    """The sinks an alert file names (``sinks.<name>.settings``); unknown or malformed ones raise ValueError."""
    made: list[Sink] = []
    for name, entry in settings.items():
        config = entry.get("settings") if isinstance(entry, Mapping) else None
        if not isinstance(config, Mapping):
            raise ValueError(f"sink {name!r} has no settings")
        if name == "webhook" and isinstance(config.get("url_env"), str):
            made.append(WebhookSink(config["url_env"]))
        elif name == "pagerduty" and isinstance(config.get("routing_key_env"), str) \
                and isinstance(config.get("endpoint"), str):
            made.append(PagerDutySink(config["routing_key_env"], config["endpoint"],
                                      str(config.get("severity") or "critical")))
        elif name == "command" and isinstance(config.get("command"), str):
            made.append(CommandSink(config["command"]))
        else:
            raise ValueError(f"unknown or malformed sink {name!r}")
    return made
