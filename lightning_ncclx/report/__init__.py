"""Summary -> text / JSON / Markdown / HTML, and the files a dump event leaves behind.
No analysis logic lives here.

Example::

    from lightning_ncclx.analysis import analyze_folder
    from lightning_ncclx.report import render_text, write_reports
    summary = analyze_folder(folder)
    print(render_text(summary))
    write_reports(summary, folder)   # summary.json, summary.txt, summary.html
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_ncclx.analysis.model import Summary
from lightning_ncclx.files import atomic_write_text
from lightning_ncclx.report.html import render_html
from lightning_ncclx.report.text import render_markdown, render_text

__all__ = ["render_html", "render_json", "render_markdown", "render_text", "write_reports"]


def render_json(summary: Summary, incident: dict | None = None) -> str:
    """The documented JSON form (``docs/summary-json.md``), with the ``incident`` block when given.
    One line per top-level key and per element of a list of objects (a finding, a row, an
    input), each written compactly by the C encoder: ``indent`` would put every rank number of
    a 16,384-rank group on a line of its own, through the pure-Python encoder."""
    data = summary.to_dict()
    if incident is not None:
        data["incident"] = incident
    lines = [f"  {json.dumps(key)}: {_value(value)}" for key, value in data.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _value(value: object) -> str:
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return "[\n" + ",\n".join(f"    {json.dumps(v)}" for v in value) + "\n  ]"
    return json.dumps(value)


def write_reports(summary: Summary, folder: str | os.PathLike) -> dict[str, Path]:
    """Write summary.json, summary.txt and summary.html into ``folder``; returns format -> path.
    ``summary.json`` carries the incident's identity (run, job, hosts, times; see ``incident.py``)."""
    from lightning_ncclx.report.incident import incident_info, kept_incident

    folder = Path(folder)
    incident = kept_incident(folder, incident_info(summary, folder))
    return {
        "json": atomic_write_text(folder / "summary.json", render_json(summary, incident)),
        "text": atomic_write_text(folder / "summary.txt", render_text(summary)),
        "html": atomic_write_text(folder / "summary.html", render_html(summary)),
    }
