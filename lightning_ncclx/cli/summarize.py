"""``lightning-ncclx summarize PATH``: exit 0 no hang, 1 a finding, 2 bad input (no traceback)."""

from __future__ import annotations

import sys
from pathlib import Path

from lightning_ncclx.errors import NcclxError
from lightning_ncclx.exit_status import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK
from lightning_ncclx.report.escape import terminal_safe

SUMMARY_FORMATS = ("text", "json", "markdown", "html")


def _render(summary, fmt: str) -> str:
    from lightning_ncclx import report

    return {"text": report.render_text, "json": report.render_json, "markdown": report.render_markdown,
            "html": report.render_html}[fmt](summary)


def run_summarize(path: Path, fmt: str = "text", output: Path | None = None) -> int:
    """Diagnose the dumps under ``path`` and print (or write to ``output``) the report.

    Example::

        run_summarize(Path("ncclx_dumps/stall-001"), fmt="json", output=Path("summary.json"))
    """
    from lightning_ncclx.analysis import Verdict, analyze_folder
    from lightning_ncclx.analysis.load import NOT_READ_IN_FULL, event_folders
    from lightning_ncclx.files import atomic_write_text

    if fmt not in SUMMARY_FORMATS:
        print(f"lightning-ncclx summarize: unknown --format {fmt!r} (choose from {', '.join(SUMMARY_FORMATS)})", file=sys.stderr)
        return EXIT_BAD_INPUT
    from lightning_ncclx.report.stragglers import episode_count, find_document, render_file

    stragglers = find_document(Path(path))  # live straggler detection's table, when the run wrote one
    events = event_folders(Path(path))
    if len(events) > 1:
        names = ", ".join(str(e.relative_to(path)) for e in events[-10:])
        print(f"lightning-ncclx summarize: {path} holds {len(events)} dump events ({names}); summarizing the "
              f"newest, {events[-1]}: pass an event's folder to choose another", file=sys.stderr)
        path = events[-1]
    try:
        summary = analyze_folder(Path(path))
    except NcclxError as exc:
        print(terminal_safe(f"lightning-ncclx summarize: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    stragglers = stragglers or find_document(Path(path))
    if not summary.ranks_seen and stragglers is not None and not summary.unreadable:
        sys.stdout.write(render_file(stragglers))  # no hang dumped: the run's straggler table is the report
        return EXIT_FINDING if episode_count(stragglers) else EXIT_OK
    if not summary.ranks_seen:
        why = "; ".join(f"{u.path}: {u.why}" for u in (summary.unreadable + summary.ignored)[:10])
        print(terminal_safe(f"lightning-ncclx summarize: no readable flight-recorder dump under {path}"
                            + (f" ({why})" if why else "")), file=sys.stderr)
        return EXIT_BAD_INPUT
    text = _render(summary, fmt)
    if stragglers is not None and fmt in ("text", "markdown"):
        table = render_file(stragglers)
        text += f"\n{table}" if fmt == "text" else f"\n## Stragglers\n\n```\n{table}```\n"
    try:
        if output is not None:
            atomic_write_text(Path(output), text)
        elif fmt == "text" and sys.stdout.isatty():
            _print_rich(text)
        else:
            _write_stdout(text)
    except OSError as exc:
        print(f"lightning-ncclx summarize: cannot write {terminal_safe(str(output))}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    for note in summary.notes:
        if note.startswith(NOT_READ_IN_FULL):
            print(terminal_safe(f"lightning-ncclx summarize: {note}"), file=sys.stderr)
    for u in summary.unreadable[:20]:
        print(terminal_safe(f"lightning-ncclx summarize: skipped {u.path}: {u.why}"), file=sys.stderr)
    if len(summary.unreadable) > 20:
        print(f"lightning-ncclx summarize: skipped {len(summary.unreadable) - 20} more unreadable files (see the "
              "JSON report)", file=sys.stderr)
    return EXIT_OK if summary.verdict is Verdict.NO_HANG else EXIT_FINDING


def _write_stdout(text: str) -> None:
    """Bytes to stdout: lone surrogates (odd file names) become escapes instead of an error."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a replaced stdout (tests): text only
        sys.stdout.write(text.encode("utf-8", "backslashreplace").decode("utf-8"))
        return
    buffer.write(text.encode("utf-8", errors="backslashreplace"))
    buffer.flush()


def _print_rich(text: str) -> None:
    try:
        from rich.console import Console
        from rich.text import Text
    except ImportError:  # pragma: no cover - rich is a dependency
        sys.stdout.write(text)
        return
    styled = Text(text)
    styled.highlight_words(["HANG:", "KIND:"], style="bold red")
    styled.highlight_words(["NO HANG FOUND:"], style="bold green")
    Console(highlight=False).print(styled, end="")
