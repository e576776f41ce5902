"""The incidents (summary.json) under many runs, tallied by
hang kind, culprit host, rank and call site; a host behind several recent incidents is flagged
and listed for SLURM's ``--exclude``. An event that recovered (every rank moved on: a wait that
ended) is counted apart and never indicts a host.

Example::

    lightning-ncclx history /shared/runs/*/ncclx_dumps --last 20
    lightning-ncclx history /shared/runs --format json | jq .exclude
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_ncclx.analysis.collection_file import recovery_from

__all__ = ["Incident", "find_incidents", "tally"]

PROGRAM_KINDS = frozenset({"program_divergence", "argument_mismatch", "program_stalled", "teardown", "no_hang"})
"""Kinds that do not indict a host: the program (or nothing) was at fault wherever it ran."""
MAX_FOLDERS = 100_000
_CONTEXT = re.compile(r"rank_\d+\.context\.json$")


@dataclass(frozen=True)
class Incident:
    folder: str
    event: str
    run_id: str | None
    job_id: str | None
    time: str | None
    kind: str
    verdict: str
    culprit_ranks: tuple[int, ...]
    culprit_hosts: tuple[str, ...]
    call_site: str | None
    op: str | None
    recovered_after_seconds: float | None = None
    """Set when the event recovered: not a hang."""


def _read(path: Path) -> Incident | None:
    try:
        d = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return _incident(d, path)


def _analyzed(folder: Path) -> Incident | None:
    """An event folder the watchdog did not summarize (it was killed first): analyze it now."""
    from lightning_ncclx.analysis import analyze_folder

    try:
        summary = analyze_folder(folder, workers=1)
    except Exception:  # noqa: BLE001 - a broken folder is reported, never fatal to the history
        return None
    if not summary.ranks_seen:
        return None
    from lightning_ncclx.report.incident import incident_info

    return _incident({**summary.to_dict(), "incident": incident_info(summary, folder, environ={})},
                     folder / "summary.json")


def _incident(d: Any, path: Path) -> Incident | None:
    if not isinstance(d, dict) or not str(d.get("schema", "")).startswith("lightning-ncclx/summary/"):
        return None
    inc = d.get("incident") if isinstance(d.get("incident"), dict) else {}
    hosts = d.get("hosts") if isinstance(d.get("hosts"), dict) else {}
    culprits = tuple(r for r in d.get("culprit_ranks") or () if isinstance(r, int))
    findings = d.get("findings") or [{}]
    states = findings[0].get("culprit_states") or [{}] if isinstance(findings[0], dict) else [{}]
    site = next((s.get("location") for s in states if isinstance(s, dict) and s.get("location")), None)
    culprit_hosts = tuple(sorted({str(hosts[str(r)]) for r in culprits if str(r) in hosts}))
    culprit_hosts = culprit_hosts or tuple(str(h) for h in (d.get("hosts_to_exclude") or ()))
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = 0.0
    from lightning_ncclx.report.incident import _iso

    recovery = recovery_from(d.get("recovery"))
    return Incident(
        recovered_after_seconds=recovery.lasted_seconds if recovery is not None else None,
        folder=str(path.parent), event=str(inc.get("event") or path.parent.name),
        run_id=inc.get("run_id"), job_id=inc.get("job_id"),
        time=inc.get("dumped_at") or inc.get("summarized_at") or _iso(mtime),
        kind=str(d.get("hang_kind") or "unknown"), verdict=str(d.get("verdict") or "?"),
        culprit_ranks=culprits, culprit_hosts=culprit_hosts, call_site=site, op=d.get("op"))


def find_incidents(paths: Iterable[Path]) -> tuple[list[Incident], list[str]]:
    """Every ``summary.json`` under ``paths`` (a summary's own ``ranks/`` copies are skipped),
    and every event folder of dumps without one (analyzed now), oldest first; and the paths that
    could not be read."""
    found: dict[str, Incident] = {}
    problems: list[str] = []
    for root in paths:
        if not root.exists():
            problems.append(f"{root}: no such file or folder")
            continue
        files = [root] if root.is_file() else []
        unsummarized: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(root) if root.is_dir() else ():
            dirnames[:] = sorted(n for n in dirnames if n != "ranks")
            if "summary.json" in filenames:
                files.append(Path(dirpath) / "summary.json")
            elif any(_CONTEXT.match(n) for n in filenames):
                unsummarized.append(Path(dirpath))
            if len(files) + len(unsummarized) > MAX_FOLDERS:
                problems.append(f"{root}: more than {MAX_FOLDERS} incidents; the rest were not read")
                break
        for folder in unsummarized:
            incident = _analyzed(folder)
            if incident is None:
                problems.append(f"{folder}: an event folder without summary.json whose dumps could not be analyzed")
            else:
                found.setdefault(str((folder / "summary.json").resolve()), incident)
        for path in files:
            incident = _read(path)
            if incident is None:
                problems.append(f"{path}: not a lightning-ncclx summary.json")
            else:
                found.setdefault(str(path.resolve()), incident)
    return sorted(found.values(), key=lambda i: (i.time or "", i.folder)), problems


def tally(incidents: list[Incident], last: int, min_count: int) -> dict[str, Any]:
    """Counts over every incident, and the hosts behind at least ``min_count`` of the last
    ``last`` incidents of a kind that indicts a host (``exclude``)."""
    recovered = [i for i in incidents if i.recovered_after_seconds is not None]
    incidents = [i for i in incidents if i.recovered_after_seconds is None]
    recent = incidents[-last:] if last > 0 else incidents
    per_host: dict[str, Counter] = {}
    for inc in recent:
        for host in inc.culprit_hosts:
            per_host.setdefault(host, Counter())[inc.kind] += 1
    recurring = []
    for host, kinds in sorted(per_host.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])):
        total = sum(kinds.values())
        host_kinds = {k: n for k, n in kinds.items() if k not in PROGRAM_KINDS}
        if total >= min_count:
            top, n = kinds.most_common(1)[0]
            message = f"host {host}: {total} of the last {len(recent)} incidents, {n} of them {top}"
            recurring.append({"host": host, "incidents": total, "of_last": len(recent), "kinds": dict(kinds),
                              "exclude": sum(host_kinds.values()) >= min_count, "message": message})
    sites = Counter(i.call_site for i in incidents if i.call_site and i.kind in PROGRAM_KINDS)
    return {
        "incidents": len(incidents), "runs": len({i.run_id for i in incidents + recovered}),
        "recovered": len(recovered),
        "by_kind": dict(Counter(i.kind for i in incidents).most_common()),
        "by_host": dict(Counter(h for i in incidents for h in i.culprit_hosts).most_common()),
        "by_rank": {str(r): n for r, n in Counter(r for i in incidents for r in i.culprit_ranks).most_common()},
        "by_call_site": dict(sites.most_common()),
        "recurring": recurring,
        "exclude": [r["host"] for r in recurring if r["exclude"]],
    }
