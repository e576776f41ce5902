"""The ``lightning-ncclx`` command: ``summarize`` a folder of dumps, ``history`` of incidents
across runs, ``doctor`` the set-up. One module per command (``cli/summarize.py``,
``cli/history.py``, ``cli/doctor.py``), each imported only when its command runs.

Exit codes: 0 all is well (no hang found / set-up sound), 1 a finding (a hang was diagnosed /
the set-up is broken), 2 bad input (unreadable path, wrong arguments).

Examples::

    lightning-ncclx summarize outputs/2026-11-30/ncclx_dumps/stall-001
    lightning-ncclx summarize ~/.cache/torch --format json --output summary.json
    lightning-ncclx history outputs/ /shared/old-runs --format json
    lightning-ncclx doctor
    lightning-ncclx dump outputs/2026-11-30/ncclx_dumps
    lightning-ncclx alerts resend outputs/2026-11-30/ncclx_dumps/stall-001
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_ncclx.exit_status import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK  # noqa: F401 - the CLI's contract
from lightning_ncclx.cli.summarize import SUMMARY_FORMATS


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-ncclx",
        description="Find the rank and collective behind a distributed-training hang.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="on an unexpected error, print the full traceback (default: one line)")
    commands = parser.add_subparsers(dest="command", required=True)

    summarize = commands.add_parser(
        "summarize",
        help="diagnose a folder of flight-recorder dumps (this plugin's, torch's own, pickle or JSON)",
    )
    summarize.add_argument("path", type=Path, help="folder of dumps (searched recursively) or one dump file")
    summarize.add_argument("--format", choices=SUMMARY_FORMATS, default="text")
    summarize.add_argument("--output", "-o", type=Path, default=None, help="write the report here instead of stdout")

    history = commands.add_parser(
        "history", help="tally every incident (summary.json) under the paths by kind, host, rank and call site")
    history.add_argument("paths", type=Path, nargs="+", help="folders of runs or incidents (searched recursively)")
    history.add_argument("--format", choices=("text", "json", "slurm"), default="text",
                         help="slurm: only the --exclude= list of hosts behind repeated incidents; json: every "
                         "field, with a Kubernetes node_affinity that keeps a job off them")
    history.add_argument("--last", type=int, default=20, help="how many recent incidents count for recurrence "
                         "(0: all)")
    history.add_argument("--min-count", type=int, default=2,
                         help="incidents a host must be behind to be flagged and listed for --exclude")

    alerts = commands.add_parser("alerts", help="alerts the watchdog kept in event folders")
    alerts_commands = alerts.add_subparsers(dest="alerts_command", required=True)
    resend = alerts_commands.add_parser("resend", help="send the alerts (alert-*.json) not yet delivered to "
                                        "every sink; secrets from the environment variables they name")
    resend.add_argument("paths", type=Path, nargs="+", help="alert files, event folders or run folders")

    dump = commands.add_parser(
        "dump", help="make every rank of a running job dump now (on-demand, no signal): writes the request "
        "file into its dump folder and waits until the job takes it")
    dump.add_argument("path", type=Path, help="the run's folder (searched for a running job's dump folder) or "
                      "the dump folder itself")
    dump.add_argument("--file", default="DUMP_NOW", help="the request file's name (the job's on_demand_file)")
    dump.add_argument("--wait", type=float, default=15.0, help="seconds to wait until the job takes the request "
                      "(0: write it and return)")

    doctor = commands.add_parser("doctor", help="report torch/Lightning/NCCL versions and the flight-recorder set-up")
    doctor.add_argument("--json", action="store_true", help="print the set-up check as JSON")
    for command in commands.choices.values():  # the error line says "rerun with --debug": after the command too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="on an unexpected error, print the full traceback")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0) and EXIT_BAD_INPUT
    try:
        return _dispatch(parser, args)
    except Exception as exc:  # the last resort: a bug must never be a wall of text
        if args.debug:
            raise
        from lightning_ncclx.report.escape import terminal_safe

        print(terminal_safe(f"lightning-ncclx {args.command}: internal error: {type(exc).__name__}: "
                            f"{str(exc)[:300]} (rerun with --debug for the traceback, and please report it)"),
              file=sys.stderr)
        return EXIT_BAD_INPUT


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "summarize":
        from lightning_ncclx.cli.summarize import run_summarize

        return run_summarize(args.path, fmt=args.format, output=args.output)
    if args.command == "history":
        from lightning_ncclx.cli.history import run_history

        return run_history(args.paths, fmt=args.format, last=args.last, min_count=args.min_count)
    if args.command == "alerts":
        from lightning_ncclx.cli.alerts import run_resend

        return run_resend(args.paths)
    if args.command == "dump":
        from lightning_ncclx.cli.dump import run_dump

        return run_dump(args.path, name=args.file, wait_seconds=args.wait)
    if args.command == "doctor":
        from lightning_ncclx.cli.doctor import run_doctor

        return run_doctor(as_json=args.json)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse enforces choices
    return EXIT_BAD_INPUT
