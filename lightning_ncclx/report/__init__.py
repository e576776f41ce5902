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
import tempfile
from pathlib import Path

from lightning_ncclx.analysis.model import Summary
from lightning_ncclx.report.html import render_html
from lightning_ncclx.report.text import render_markdown, render_text

__all__ = ["render_html", "render_json", "render_markdown", "render_text", "write_atomic", "write_reports"]


def render_json(summary: Summary, incident: dict | None = None) -> str:
    """The documented JSON form (``docs/summary-json.md``), with the ``incident`` block when given."""
    data = summary.to_dict()
    if incident is not None:
        data["incident"] = incident
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def write_atomic(path: Path, text: str) -> Path:
    """Write via a temporary file in the same folder and ``os.replace`` (readers never see half)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_reports(summary: Summary, folder: str | os.PathLike) -> dict[str, Path]:
    """Write summary.json, summary.txt and summary.html into ``folder``; returns format -> path.
    ``summary.json`` carries the incident's identity (run, job, hosts, times; see ``incident.py``)."""
    from lightning_ncclx.report.incident import incident_info, kept_incident

    folder = Path(folder)
    incident = kept_incident(folder, incident_info(summary, folder))
    return {
        "json": write_atomic(folder / "summary.json", render_json(summary, incident)),
        "text": write_atomic(folder / "summary.txt", render_text(summary)),
        "html": write_atomic(folder / "summary.html", render_html(summary)),
    }
