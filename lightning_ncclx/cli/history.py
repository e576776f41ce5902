"""``lightning-ncclx history PATH...``: every incident under the paths, tallied (see
:mod:`lightning_ncclx.report.history`); exit 0 nothing recurs, 1 a host recurs, 2 no incident."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lightning_ncclx.exit_status import EXIT_BAD_INPUT, EXIT_OK
from lightning_ncclx.exit_status import EXIT_FINDING as EXIT_FOUND
from lightning_ncclx.cli.history_formats import node_affinity, plain_hosts, slurm_exclude
from lightning_ncclx.report.escape import terminal_safe
from lightning_ncclx.report.history import Incident, find_incidents, tally


def run_history(paths: list[Path], fmt: str = "text", last: int = 20, min_count: int = 2,
                out: Any = None) -> int:
    """Print the history; exit 0 nothing recurs, 1 a host recurs (``exclude`` not empty), 2 no incident.
    A file that is no incident is listed (``skipped``) and the others are read."""
    out = out or sys.stdout
    incidents, problems = find_incidents(paths)
    for p in problems:
        print(terminal_safe(f"lightning-ncclx history: skipped {p}"), file=sys.stderr)
    if not incidents:
        under = ", ".join(map(str, paths))
        print(terminal_safe(f"lightning-ncclx history: no incident (summary.json) under {under}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    result = tally(incidents, last, min_count)
    hosts, odd = plain_hosts(result["exclude"])
    for host in odd:
        print(f"lightning-ncclx history: left out of the exclude list, not a plain host name: {host!r}", file=sys.stderr)
    if fmt == "slurm":
        out.write(slurm_exclude(hosts) + "\n")
    elif fmt == "json":
        result["node_affinity"] = node_affinity(hosts)
        result["list"] = [asdict(i) for i in incidents]
        result["skipped"] = problems
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        _print_tables(incidents, result, last, out)
    return EXIT_FOUND if result["exclude"] else EXIT_OK


def _store_lost_line(i: Incident) -> str:
    wrote = ", ".join(map(str, i.dumped_ranks)) or "none"
    missing = ", ".join(map(str, i.missing_ranks)) or "none"
    seen = f" (a writer saw: {i.store_lost_seen})" if i.store_lost_seen else ""
    then = (f"summarized: {i.kind}" if i.kind != "store_lost" else
            f"not summarized: `lightning-ncclx summarize {i.folder}` for the verdict")
    return (f"{i.event} in {i.folder}: the job's store was lost{seen}; rank(s) {wrote} wrote their dumps there, "
            f"rank(s) {missing} did not (the store's host among them); {then}")


def _shown(value: Any) -> str:
    """Text from a summary.json as the console shows it: no control characters, no markup."""
    from rich.markup import escape

    return escape(terminal_safe(str(value)))


def _print_tables(incidents: list[Incident], result: dict[str, Any], last: int, out: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, highlight=False, width=max(100, Console(file=out).width), soft_wrap=False)
    recovered = f", {result['recovered']} of them recovered" if result["recovered"] else ""
    table = Table(title=f"{len(incidents)} incident(s){recovered} in {result['runs']} run(s), oldest first"
                        + (f" (last {last} shown)" if 0 < last < len(incidents) else ""))
    for name in ("time", "run / job", "event", "kind", "culprit", "host", "call site"):
        table.add_column(name, overflow="fold")
    for i in incidents[-last:] if last > 0 else incidents:
        run = " / ".join(x for x in (i.run_id, i.job_id) if x) or "-"
        kind = i.kind if i.recovered_after_seconds is None else f"recovered after {i.recovered_after_seconds:.1f} s"
        culprit = ", ".join(map(str, i.culprit_ranks)) or "-"
        if i.store_lost and not i.culprit_ranks:
            culprit = f"missing {', '.join(map(str, i.missing_ranks)) or '-'}"
        table.add_row(*map(_shown, (i.time or "-", run, i.event, kind, culprit,
                                    ", ".join(i.culprit_hosts) or "-", i.call_site or "-")))
    console.print(table)
    for i in incidents[-last:] if last > 0 else incidents:
        if i.store_lost:
            console.print(_shown(_store_lost_line(i)))
    console.print("by kind: " + (", ".join(f"{_shown(k)} {n}" for k, n in result["by_kind"].items()) or "none"))
    if result["recovered"]:
        console.print(f"recovered (waits that ended, not hangs; counted apart): {result['recovered']}")
    for name, key in (("host", "by_host"), ("rank", "by_rank")):
        if result[key]:
            counts = list(result[key].items())[:8]
            console.print(f"by culprit {name}: " + ", ".join(f"{_shown(k)} {n}" for k, n in counts))
    if result["by_call_site"]:
        console.print("program errors by call site: " + "; ".join(f"{_shown(s)} ({n})" for s, n in
                                                                   list(result["by_call_site"].items())[:5]))
    for r in result["recurring"]:
        console.print(("[bold red]RECURRING[/] " if r["exclude"] else "recurring ") + _shown(r["message"]))
    if result["exclude"]:
        hosts = _shown(",".join(result["exclude"]))
        console.print(f"exclude: {hosts}   (sbatch --exclude={hosts})")
    else:
        console.print("exclude: none (no host behind repeated incidents of a host-related kind)")
