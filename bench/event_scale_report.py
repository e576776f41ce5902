"""Tables of ``bench_event_scale.py``: per phase, and the protocols side by side."""

from __future__ import annotations

from collections import Counter
from typing import Any

from scale_ranks import BUCKET_SECONDS

MIB = 1 << 20
NEW_GOALS = ("ring to summary.json <= {goal:.0f} s", "store server <= 1 core", "every rank leaves with the kind's "
             "exit status", "no key left but the event log", "<= 5 MiB through the store")


def phase_rows(phases: list[tuple[str, float, float]], table: Counter, sampler: Any, epoch: float) -> list[dict]:
    rows = []
    for name, start, end in phases:
        ops: Counter = Counter()
        by_op: Counter = Counter()
        payload = dumps = 0
        for (bucket, op, what), value in table.items():
            at = epoch + (bucket + 0.5) * BUCKET_SECONDS
            if start <= at < end or (name == phases[-1][0] and at >= end):
                if what == "n":
                    ops[op] += value
                elif what == "bytes":
                    payload += value
                    by_op[op] += value
                else:
                    dumps += value
        cpu, sock, clients = sampler.between(start, end)
        seconds = max(end - start, 1e-6)
        span = max(sampler.span(start, end), 1e-6)
        rows.append({"phase": name, "seconds": end - start, "requests": sum(ops.values()),
                     "requests_per_s": sum(ops.values()) / seconds, "server_cpu_pct": 100 * cpu / span,
                     "client_cpu_pct": 100 * clients / span, "payload_bytes": payload, "socket_bytes": sock,
                     "dump_bytes": dumps, "server_cpu_seconds": cpu, "ops": dict(ops.most_common(4)),
                     "bytes_by_op": dict(by_op)})
    return rows


def _mib(n: float) -> str:
    return f"{n / MIB:.2f}"


def print_size(row: dict) -> None:
    shared = row.get("ranks_per_connection", 1)
    sharing = (f"; the {shared} ranks of a host share one request connection, each keeps its doorbell's (the store "
               f"server may open {row.get('server_files_limit')} files here)") if shared > 1 else ""
    print(f"\n### {row['ranks']} ranks, {row['protocol']} protocol (connected in {row['connect_seconds']:.0f} s; "
          f"announcement with digest {row['digest_bytes']:.0f} B, made in {row['digest_make_ms']:.1f} ms per rank"
          f"{sharing})")
    print("| phase | s | requests | requests/s | server CPU % of a core | clients' CPU % | payload MiB | "
          "socket MiB | top requests |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in row["phases"]:
        ops = ", ".join(f"{op} {n}" for op, n in p["ops"].items())
        print(f"| {p['phase']} | {p['seconds']:.2f} | {p['requests']:,} | {p['requests_per_s']:,.0f} | "
              f"{p['server_cpu_pct']:.0f} | {p['client_cpu_pct']:.0f} | {_mib(p['payload_bytes'])} | "
              f"{_mib(p['socket_bytes'])} | {ops} |")
    print(f"keys left: {row['keys_left']}; exit status: {row['exit_status']}")
    outcome = row["outcome"]
    if row["protocol"] == "new":
        print(f"verdict {outcome.get('verdict')}, kind {outcome.get('kind')}, culprits {outcome.get('culprits')}, full "
              f"dumps of {outcome.get('want')}; {outcome.get('digest_only')} digests only; refused "
              f"{outcome.get('refused')}; reports {outcome.get('summary_files')}")
    if row["errors"]:
        print(f"errors on simulated ranks: {row['errors']}")


def totals(row: dict, upto: str | None = None) -> dict:
    phases = row["phases"]
    if upto is not None:
        names = [p["phase"] for p in phases]
        phases = phases[:names.index(upto) + 1] if upto in names else phases
    seconds = sum(p["seconds"] for p in phases)
    return {"seconds": seconds, "requests": sum(p["requests"] for p in phases),
            "payload": sum(p["payload_bytes"] for p in phases), "socket": sum(p["socket_bytes"] for p in phases),
            "dumps": sum(p["dump_bytes"] for p in phases),
            "server_cpu_seconds": sum(p["server_cpu_seconds"] for p in phases),
            "cpu_pct": sum(p["server_cpu_pct"] * p["seconds"] for p in phases) / max(seconds, 1e-6),
            "peak_cpu_pct": max((p["server_cpu_pct"] for p in phases if p["seconds"] >= 0.2), default=0.0),
            "peak_rps": max((p["requests_per_s"] for p in phases if p["seconds"] >= 0.2), default=0.0)}


def print_summary(rows: list[dict], goal: float) -> None:
    print("\n## Side by side (whole event; ring to summary.json in the first column)")
    print("| ranks | protocol | ring to summary.json (s) | whole event (s) | requests | peak requests/s | store server CPU "
          "(s; % of a core over the event) | announcements, digests and full dumps written (MiB) | every request's "
          "keys and values (MiB) | socket bytes (MiB) | keys left | exit status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        to_summary, whole = totals(row, "summary"), totals(row)
        cpu = row["server_cpu_seconds"]["event"]
        print(f"| {row['ranks']} | {row['protocol']} | {to_summary['seconds']:.1f} | {whole['seconds']:.1f} | "
              f"{whole['requests']:,} | {whole['peak_rps']:,.0f} | {cpu:.1f}; {100 * cpu / max(whole['seconds'], 1e-6):.0f} % | "
              f"{_mib(whole['dumps'])} | {_mib(whole['payload'])} | {_mib(whole['socket'])} | {_left(row['keys_left'])} | "
              f"{_statuses(row['exit_status'])} |")
    for row in rows:
        old = next((r for r in rows if r["ranks"] == row["ranks"] and r["protocol"] == "old"), None)
        if row["protocol"] != "new" or old is None:
            continue
        a, b = totals(row), totals(old)
        print(f"{row['ranks']} ranks, old / new: requests x{b['requests'] / max(a['requests'], 1):.1f}, store server CPU "
              f"x{old['server_cpu_seconds']['event'] / max(row['server_cpu_seconds']['event'], 1e-6):.1f}, dumps written "
              f"x{b['dumps'] / max(a['dumps'], 1):.1f}, request payload x{b['payload'] / max(a['payload'], 1):.1f}, "
              f"socket bytes x{b['socket'] / max(a['socket'], 1):.1f}")
    biggest = max((r for r in rows if r["protocol"] == "new"), key=lambda r: r["ranks"], default=None)
    if biggest is not None:
        _goals(biggest, goal)


def initiator_work(row: dict) -> float:
    """The summarizing rank's own work to summary.json: expanding the digests, the first
    diagnosis, the summary and its reports (wall seconds)."""
    phase = {p["phase"]: p for p in row["phases"]}
    return sum(phase[n]["seconds"] for n in ("digests", "first_diagnosis", "summary") if n in phase)


def estimate(row: dict) -> tuple[float, float, float]:
    """(the store server's busy seconds in the ring and announcements, the initiator's own work,
    the rest of the way to summary.json): their sum is the time to summary.json with each rank's
    Python on its own host."""
    phase = {p["phase"]: p for p in row["phases"]}
    announce = sum(phase[n]["seconds"] for n in ("ring", "announce") if n in phase)
    local = initiator_work(row)
    between = totals(row, "summary")["seconds"] - announce - local
    return row["server_cpu_seconds"]["ring_announce"], local, between


def print_baseline(rows: list[dict]) -> None:
    """Each size's current run against the baseline's (``--baseline``), as ratios with the times."""
    print("\n## Against the baseline (same run; ratio current / baseline)")
    print("| ranks | initiator's work to summary.json (s) | ring to summary.json (s) | whole event (s) | requests per "
          "rank per event | estimate, each rank on its own host (s) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        base = next((r for r in rows if r["ranks"] == row["ranks"] and r["protocol"].startswith("baseline")), None)
        if row["protocol"] != "new" or base is None:
            continue
        cells = []
        for value in (initiator_work, lambda r: totals(r, "summary")["seconds"], lambda r: totals(r)["seconds"],
                      lambda r: totals(r)["requests"] / r["ranks"], lambda r: sum(estimate(r))):
            a, b = value(row), value(base)
            cells.append(f"{a:.2f} / {b:.2f} = x{a / max(b, 1e-9):.2f}")
        print(f"| {row['ranks']} | " + " | ".join(cells) + " |")
    print(f"({next((r['protocol'] for r in rows if r['protocol'].startswith('baseline')), 'no baseline')})")


def _left(keys: dict[str, int]) -> str:
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(keys.items())) or "none"


def _statuses(statuses: dict[str, int]) -> str:
    return ", ".join(f"{n} x {s}" for s, n in statuses.items())


def _goals(row: dict, goal: float) -> None:
    to_summary, whole = totals(row, "summary"), totals(row)
    kind_code = row["outcome"].get("initiator_code")
    wrong = {s: n for s, n in row["exit_status"].items() if not s.startswith(f"{kind_code} ")}
    extra = {k: n for k, n in row["keys_left"].items() if not (k.endswith("/meta") or k.startswith("lightning_ncclx/procs"))}
    phase = {p["phase"]: p for p in row["phases"]}
    announce = sum(phase[n]["seconds"] for n in ("ring", "announce") if n in phase)
    local = sum(phase[n]["seconds"] for n in ("digests", "first_diagnosis", "summary") if n in phase)
    files = phase["digest_files"]["seconds"] if "digest_files" in phase else 0.0
    busy = row["server_cpu_seconds"]["ring_announce"]
    clients = sum(phase[n]["client_cpu_pct"] * phase[n]["seconds"] / 100 for n in ("ring", "announce") if n in phase)
    cpu = row["server_cpu_seconds"]["event"]
    print(f"\nGoals at {row['ranks']} ranks (current protocol):")
    checks = [
        (to_summary["seconds"] <= goal, f"ring to summary.json {to_summary['seconds']:.1f} s (goal {goal:.0f} s, "
         f"x{to_summary['seconds'] / goal:.2f}): ring and announcements {announce:.1f} s, in which the store server was "
         f"busy {busy:.1f} s and the simulated ranks' Python {clients:.1f} s of CPU on these 2 cores (a real job runs it "
         f"on its {row['ranks']} ranks' own hosts); the initiator's own work {local:.1f} s (expanding the digests, the "
         f"first diagnosis, the summary and its reports; the digests' files are finished {files:.1f} s after it)"),
        (cpu <= whole["seconds"], f"store server {cpu:.1f} s of CPU in {whole['seconds']:.1f} s: "
                                  f"{100 * cpu / max(whole['seconds'], 1e-6):.0f} % of a core over the event, "
                                  f"{whole['peak_cpu_pct']:.0f} % in its busiest phase (goal: at most one core)"),
        (not wrong, f"exit status: {_statuses(row['exit_status'])}"),
        (not extra, f"keys left: {_left(row['keys_left'])} (by design: ev/<n>/meta, the event log; procs/<host>, one "
                    "registration line per watchdog)"),
        (whole["dumps"] <= 5 * MIB, f"announcements, digests and full dumps written: {_mib(whole['dumps'])} MiB (goal 5 "
                                    f"MiB); every request's keys and values {_mib(whole['payload'])} MiB, socket bytes "
                                    f"{_mib(whole['socket'])} MiB (reads of these values, rings, rosters, framing)"),
    ]
    for ok, text in checks:
        print(f"- {'met' if ok else 'MISSED'}: {text}")
    busy, local, between = estimate(row)
    print(f"- estimate with each rank's Python on its own host: the store server's {busy:.1f} s of the ring and "
          f"announcements + the initiator's {local:.1f} s + the rest of the way to summary.json ({between:.1f} s: asking "
          f"for and pulling the full dumps) = {busy + local + between:.1f} s (goal {goal:.0f} s)")
    by_op: Counter = Counter()
    for p in row["phases"]:
        by_op.update(p.get("bytes_by_op", {}))
    print("  request payload by operation (MiB): " + ", ".join(f"{op} {_mib(n)}" for op, n in by_op.most_common(6)))
