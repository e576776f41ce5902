"""The incidents (summary.json) under many runs, tallied by
hang kind, culprit host, rank and call site; a host behind several recent incidents is flagged
and listed for SLURM's ``--exclude``. An event that recovered (every rank moved on: a wait that
ended) is counted apart and never indicts a host. A ``store-lost-NNN`` folder (the job's store
died with its host; the survivors dumped alone) is an incident of kind ``store_lost`` until a
``summarize`` of it is written there.

Example::

    lightning-ncclx history /shared/runs/*/ncclx_dumps --last 20
    lightning-ncclx history /shared/runs --format json | jq .exclude
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning_ncclx.report.incident_file import Incident, NotAnIncident, incident_from, read_incident
from lightning_ncclx.report.store_lost import is_store_lost_folder, store_lost_incident

__all__ = ["Incident", "find_incidents", "tally"]

PROGRAM_KINDS = frozenset({"program_divergence", "argument_mismatch", "program_stalled", "teardown", "no_hang"})
"""Kinds that do not indict a host: the program (or nothing) was at fault wherever it ran."""
MAX_FOLDERS = 100_000
_CONTEXT = re.compile(r"rank_\d+\.context\.json$")


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

    try:
        return incident_from({**summary.to_dict(), "incident": incident_info(summary, folder, environ={})},
                             folder / "summary.json")
    except NotAnIncident:
        return None


def _store_lost(folder: Path, problems: list[str]) -> Incident | None:
    """A ``store-lost-NNN`` folder: what its writers' contexts say, with the summary of a later
    ``summarize`` where one was written there (never analyzed here: its dumps are the survivors'
    only, and its kind is what the summary says, or ``store_lost``)."""
    summarized = None
    if (folder / "summary.json").exists() or (folder / "summary.json").is_symlink():
        try:
            summarized = read_incident(folder / "summary.json")
        except NotAnIncident as why:
            problems.append(f"{folder / 'summary.json'}: {why}")
    incident = store_lost_incident(folder, summarized)
    if incident is None:
        problems.append(f"{folder}: a store-lost folder with no readable rank context")
    return incident


def find_incidents(paths: Iterable[Path]) -> tuple[list[Incident], list[str]]:
    """Every ``summary.json`` under ``paths`` (a summary's own ``ranks/`` copies are skipped),
    every event folder of dumps without one (analyzed now) and every ``store-lost-NNN`` folder
    (the ranks that wrote there and those that did not), oldest first; and the paths that could
    not be read."""
    found: dict[str, Incident] = {}
    problems: list[str] = []
    for root in paths:
        if not root.exists():
            problems.append(f"{root}: no such file or folder")
            continue
        files = [] if root.is_dir() else [root]  # a FIFO or device given by name is refused by the read
        unsummarized: list[Path] = []
        store_lost: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(root) if root.is_dir() else ():
            dirnames[:] = sorted(n for n in dirnames if n != "ranks")
            if is_store_lost_folder(Path(dirpath)) and ("summary.json" in filenames
                                                        or any(_CONTEXT.match(n) for n in filenames)):
                store_lost.append(Path(dirpath))
            elif "summary.json" in filenames:
                files.append(Path(dirpath) / "summary.json")
            elif any(_CONTEXT.match(n) for n in filenames):
                unsummarized.append(Path(dirpath))
            if len(files) + len(unsummarized) + len(store_lost) > MAX_FOLDERS:
                problems.append(f"{root}: more than {MAX_FOLDERS} incidents; the rest were not read")
                break
        for folder in unsummarized:
            incident = _analyzed(folder)
            if incident is None:
                problems.append(f"{folder}: an event folder without summary.json whose dumps could not be analyzed")
            else:
                found.setdefault(str((folder / "summary.json").resolve()), incident)
        for folder in store_lost:
            incident = _store_lost(folder, problems)
            if incident is not None:
                found.setdefault(str((folder / "summary.json").resolve()), incident)
        for path in files:
            try:
                incident = read_incident(path)
            except NotAnIncident as why:
                problems.append(f"{path}: {why}")
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
