"""``lightning-ncclx doctor [--json]``: the set-up check of :mod:`lightning_ncclx.backend.doctor`, as a
table or as JSON; exit 0 sound, 1 broken."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from lightning_ncclx.backend.doctor import SetupCheck, check_setup
from lightning_ncclx.config import WatchdogConfig
from lightning_ncclx.watchdog.triggers import describe_signal


def _on_demand_signal(check: SetupCheck) -> str:
    """The default on-demand signal as this process has it after importing torch (and CUDA's
    set-up, where a device is there); a native handler there is noted."""
    name = WatchdogConfig().on_demand_signal or "SIGUSR2"
    text, held_natively = describe_signal(name)
    if held_natively:
        check.notes.append(text)
    return text


def _print_rich(check: SetupCheck, signal_text: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="lightning-ncclx doctor", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for name, version in check.versions.items():
        table.add_row(name, version or "-")
    table.add_row('"nccl" resolves to', check.nccl_resolution)
    table.add_row("CUDA devices", ", ".join(check.cuda_devices) or "none")
    table.add_row("backends", ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in check.backends.items()))
    variables = "\n".join(f"{k}={v}" for k, v in check.recorder_variables.items()) or "(none set: torch defaults)"
    table.add_row("recorder variables", variables)
    table.add_row("on-demand signal", signal_text)
    console.print(table)
    for note in check.notes:
        console.print(f"[cyan]note:[/] {note}")
    for problem in check.problems:
        console.print(f"[bold red]problem:[/] {problem}")
    console.print("[bold red]set-up is broken[/]" if check.broken else "[bold green]set-up looks sound[/]")


def run_doctor(as_json: bool = False) -> int:
    try:
        check = check_setup()
    except ImportError as err:
        print(f"lightning-ncclx doctor: cannot import {err.name or err}: is torch installed?", file=sys.stderr)
        return 1
    signal_text = _on_demand_signal(check)
    if as_json:
        print(json.dumps({**asdict(check), "on_demand_signal": signal_text, "broken": check.broken}, indent=2))
    else:
        _print_rich(check, signal_text)
    return 1 if check.broken else 0
