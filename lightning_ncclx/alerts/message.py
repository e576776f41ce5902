"""The alert document: job identity, kind, culprits, group and collective, first advice, restart
advice, exit status and where the summary is, read from the event's ``summary.json``; and the
lower-severity straggler warning, from a straggler episode.

Webhooks get it as is (``text`` is the one-screen headline Slack shows); PagerDuty gets it as
``custom_details``."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Mapping

import lightning_ncclx.analysis.rank_sets as rank_sets

ALERT_SCHEMA = "lightning-ncclx/alert/1"
MAX_SUMMARY_BYTES = 64 * 1024 * 1024
_JOB_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_CLUSTER_NAME", "TORCHELASTIC_RUN_ID", "PBS_JOBID",
                  "LSB_JOBID")
TEXT_LIMIT = 3000


def read_summary(folder: Path) -> dict[str, Any] | None:
    """``folder/summary.json`` as a dict; None when absent, too big or not a JSON object."""
    path = folder / "summary.json"
    try:
        if path.stat().st_size > MAX_SUMMARY_BYTES:
            return None
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _culprits(summary: Mapping[str, Any]) -> list[int]:
    """``culprit_ranks``: a list, or ranges past 64 ranks (schema 2); [] when malformed."""
    try:
        return list(rank_sets.decode(summary.get("culprit_ranks", [])))
    except ValueError:
        return []


def _culprit_hosts(summary: Mapping[str, Any], culprits: list[int]) -> list[str]:
    try:
        hosts = rank_sets.rank_map(summary, "host_ranks", "hosts")  # schema 2, else schema 1's rank -> host
    except ValueError:
        hosts = {}
    return sorted({hosts[r] for r in culprits if r in hosts})


def job_identity(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {name.lower(): env[name] for name in _JOB_VARIABLES if env.get(name)}


def trigger_document(folder: Path, summary: Mapping[str, Any], *, event: str, reason: str, exit_code: int | None,
                     dedup_key: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a trigger says about the confirmed event in ``folder`` (``summary``: its summary.json, or {})."""
    incident = summary.get("incident") if isinstance(summary.get("incident"), dict) else {}
    culprits = _culprits(summary)
    group = summary.get("process_group") if isinstance(summary.get("process_group"), dict) else {}
    advice = [str(a) for a in _list(summary.get("advice"))]
    restart = summary.get("restart_advice") if isinstance(summary.get("restart_advice"), dict) else {}
    kind = str(summary.get("hang_kind") or "unknown")
    headline = str(summary.get("headline") or f"{reason} event {event}: no summary (the analysis did not run); "
                                                 f"dumps in {folder}")
    exit_text = f"; the job exits with {exit_code}" if exit_code is not None else "; the job keeps waiting"
    hosts = _culprit_hosts(summary, culprits)
    text = (f"lightning-ncclx: hang confirmed ({kind}) in {incident.get('run_id') or folder.parent.name}/{event}"
            f"{exit_text}\n{headline}"
            + (f"\nculprit rank(s) {', '.join(map(str, culprits))}" + (f" on {', '.join(hosts)}" if hosts else "")
               if culprits else "")
            + (f"\nnext: {advice[0]}" if advice else "")
            + (f"\nrestart: {restart.get('action')}" if restart.get("action") else "")
            + f"\nsummary: {folder / 'summary.html'}")
    return {
        "schema": ALERT_SCHEMA,
        "action": "trigger",
        "dedup_key": dedup_key,
        "alert_id": f"{dedup_key}/trigger",
        "text": text[:TEXT_LIMIT],
        "event": event,
        "reason": reason,
        "kind": kind,
        "verdict": summary.get("verdict"),
        "headline": headline,
        "culprit_ranks": culprits,
        "culprit_hosts": hosts,
        "process_group": {k: group.get(k) for k in ("name", "desc", "backend") if k in group} or None,
        "op": summary.get("op"),
        "collective_seq_id": summary.get("collective_seq_id"),
        "advice": advice[0] if advice else None,
        "restart_advice": {k: restart.get(k) for k in ("action", "reason", "hosts_to_exclude") if k in restart},
        "exit_code": exit_code,
        "run_id": incident.get("run_id"),
        "job": job_identity(environ),
        "source_host": socket.gethostname(),
        "folder": str(folder.absolute()),
        "summary_json": str((folder / "summary.json").absolute()),
        "summary_html": str((folder / "summary.html").absolute()),
    }


def resolve_document(trigger: Mapping[str, Any], lasted_seconds: float) -> dict[str, Any]:
    """The resolve of an earlier trigger: same dedup key, event and folder."""
    event = trigger.get("event")
    return {
        "schema": ALERT_SCHEMA,
        "action": "resolve",
        "dedup_key": trigger.get("dedup_key"),
        "alert_id": f"{trigger.get('dedup_key')}/resolve",
        "text": f"lightning-ncclx: {trigger.get('run_id') or ''}/{event} recovered after {lasted_seconds:.1f} s: "
                f"every rank moved on (resolves the {trigger.get('kind')} alert)",
        "event": event,
        "kind": trigger.get("kind"),
        "recovered_after_seconds": round(lasted_seconds, 3),
        "run_id": trigger.get("run_id"),
        "job": trigger.get("job"),
        "source_host": trigger.get("source_host"),
        "folder": trigger.get("folder"),
        "summary_json": trigger.get("summary_json"),
        "summary_html": trigger.get("summary_html"),
    }


def dedup_key(folder: Path, summary: Mapping[str, Any], event: str, opened: float | None = None) -> str:
    """Stable for the event's trigger and resolve, distinct between runs and folders.

    ``opened``: the event's opening time from its meta in the job's store (``EventMeta.opened``),
    which every rank of the job reads alike: the key is then the same on every host whatever
    its dump folder's path, so a trigger sent twice (the summarizing rank dies after sending,
    before its claim says so) is one incident to PagerDuty and one ``dedup_key`` to a webhook's
    reader. Without it (an alert made offline), the folder's path tells runs apart."""
    if opened is not None:
        return f"lightning-ncclx/{folder.absolute().parent.name}/{event}/{round(opened * 1000):x}"
    incident = summary.get("incident") if isinstance(summary.get("incident"), dict) else {}
    run = incident.get("run_id") or folder.absolute().parent.name
    return f"lightning-ncclx/{run}/{hashlib.sha1(str(folder.absolute()).encode()).hexdigest()[:8]}/{event}"


STRAGGLER_SEVERITY = "warning"


def straggler_document(folder: Path, episode: Mapping[str, Any], *, environ: Mapping[str, str] | None = None
                       ) -> dict[str, Any]:
    """A warning that straggler detection named a slow rank (``episode``: its ``to_json()``);
    ``folder``: the run's dump folder, where ``stragglers.json`` is."""
    rank, host = episode.get("rank"), str(episode.get("host") or "")
    run = folder.absolute().name
    key = hashlib.sha1(str(folder.absolute()).encode()).hexdigest()[:8]
    message = str(episode.get("message") or f"rank {rank} is slower than its peers")
    return {
        "schema": ALERT_SCHEMA,
        "action": "trigger",
        "severity": STRAGGLER_SEVERITY,
        "dedup_key": f"lightning-ncclx/{run}/{key}/straggler-rank{rank}",
        "alert_id": f"lightning-ncclx/{run}/{key}/straggler-rank{rank}-interval{episode.get('opened_interval')}",
        "text": f"lightning-ncclx: straggler warning in {run} (not a hang: the job goes on)\n{message}"[:TEXT_LIMIT],
        "event": f"straggler-rank{rank}-interval{episode.get('opened_interval')}",
        "reason": "straggler",
        "kind": "straggler",
        "headline": message,
        "culprit_ranks": [rank] if isinstance(rank, int) else [],
        "culprit_hosts": [host] if host else [],
        "part": episode.get("part"),
        "score_max": episode.get("score_max"),
        "episode": dict(episode),
        "exit_code": None,
        "run_id": run,
        "job": job_identity(environ),
        "source_host": socket.gethostname(),
        "folder": str(folder.absolute()),
        "stragglers_json": str((folder / "stragglers.json").absolute()),
    }
