"""Summary -> text / JSON / Markdown / HTML, and the files a dump event leaves behind.
No analysis logic lives here.

Example::

    from lightning_ncclx.analysis import analyze_folder
    from lightning_ncclx.report import render_text, write_reports
    summary = analyze_folder(folder)
    print(render_text(summary))
    write_reports(summary, folder)   # summary.json, summary.txt, summary.html, summary-ranks.json

``write_reports`` is :func:`write_first` (``summary.json``: the kind, culprits, headline and
advice) then :func:`write_rest` (the text and HTML reports, then the per-rank detail): a caller
that has something to do as soon as the first answer is on disk calls the two itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_ncclx.analysis.model import Summary
from lightning_ncclx.files import atomic_write_text
from lightning_ncclx.layout import RANK_DETAIL_FILE
from lightning_ncclx.report.html import render_html
from lightning_ncclx.report.text import render_markdown, render_text

__all__ = ["render_html", "render_json", "render_markdown", "render_rank_detail", "render_text", "write_first",
           "write_rest", "write_reports"]


def render_json(summary: Summary, incident: dict | None = None, rank_detail: str | None = None) -> str:
    """The documented JSON form (``docs/summary-json.md``), with the ``incident`` block when given
    and ``rank_detail`` naming the per-rank detail file written beside it (else null).
    One line per top-level key and per element of a list of objects (a finding, a row, an
    input), each written compactly by the C encoder: ``indent`` would put every rank number of
    a long list on a line of its own, through the pure-Python encoder."""
    data = summary.to_dict()
    data["rank_detail"] = rank_detail
    if incident is not None:
        data["incident"] = incident
    return _document(data)


def render_rank_detail(summary: Summary) -> str:
    """The per-rank detail file (``summary-ranks.json``): :meth:`Summary.rank_detail`."""
    return _document(summary.rank_detail())


def _document(data: dict) -> str:
    lines = [f"  {json.dumps(key)}: {_value(value)}" for key, value in data.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _value(value: object) -> str:
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return "[\n" + ",\n".join(f"    {json.dumps(v)}" for v in value) + "\n  ]"
    return json.dumps(value)


def write_first(summary: Summary, folder: str | os.PathLike) -> Path:
    """``summary.json`` into ``folder``, before any other report: the hang kind, culprits,
    headline and advice, in a file of at most a few hundred KiB at 16,384 ranks. It carries the
    incident's identity (run, job, hosts, times; see ``incident.py``) and names the per-rank
    detail file that :func:`write_rest` writes after it."""
    from lightning_ncclx.report.incident import incident_info, kept_incident

    folder = Path(folder)
    incident = kept_incident(folder, incident_info(summary, folder))
    return atomic_write_text(folder / "summary.json", render_json(summary, incident, RANK_DETAIL_FILE))


def write_rest(summary: Summary, folder: str | os.PathLike, text: str | None = None) -> dict[str, Path]:
    """The reports after ``summary.json``: ``summary.txt``, ``summary.html``, then the per-rank
    detail (``summary-ranks.json``, the slowest); returns format -> path. ``text``: what
    :func:`render_text` gives for ``summary``, where the caller has it already."""
    folder = Path(folder)
    return {
        "text": atomic_write_text(folder / "summary.txt", render_text(summary) if text is None else text),
        "html": atomic_write_text(folder / "summary.html", render_html(summary)),
        "ranks": atomic_write_text(folder / RANK_DETAIL_FILE, render_rank_detail(summary)),
    }


def write_reports(summary: Summary, folder: str | os.PathLike) -> dict[str, Path]:
    """:func:`write_first`, then :func:`write_rest`: ``summary.json``, ``summary.txt``,
    ``summary.html`` and ``summary-ranks.json`` into ``folder``, in that order; returns
    format -> path."""
    return {"json": write_first(summary, folder), **write_rest(summary, folder)}
