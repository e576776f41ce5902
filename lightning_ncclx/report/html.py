"""A self-contained HTML page (inline CSS and SVG, no external assets) with a per-rank timeline
of the last collectives that marks where each rank stopped."""

from __future__ import annotations

import html
import json

from lightning_ncclx.analysis.model import RankRow, Summary, Verdict
from lightning_ncclx.report.text import display_rows, render_text

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.3em}
.bad{color:#b00}.ok{color:#070}table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:2px 6px}
pre{background:#f6f6f6;padding:.6em;overflow:auto}.culprit{background:#fee}svg text{font:10px monospace}"""
MAX_ROWS = 256
CELL = 64
LABEL = 110
_OP_ABBREVIATIONS = {"all_reduce": "AR", "allreduce": "AR", "all_gather": "AG", "allgather": "AG",
                     "_allgather_base": "AG", "all_gather_into_tensor": "AG", "reduce_scatter": "RS",
                     "_reduce_scatter_base": "RS", "reduce_scatter_tensor": "RS", "broadcast": "BC", "barrier": "BAR",
                     "all_to_all": "A2A", "alltoall": "A2A", "alltoall_base": "A2A", "reduce": "RED",
                     "gather": "GA", "scatter": "SC", "send": "SEND", "recv": "RECV"}


def _cell_label(op: str, seq: int, group: str, several_groups: bool) -> str:
    short = _OP_ABBREVIATIONS.get(op.split(" ")[0], op[:4].upper())
    return f"{'g' + group + ' ' if several_groups else ''}{short} {seq}"


def _timeline_svg(rows: tuple[RankRow, ...], culprits: set[int]) -> str:
    several_groups = len({op.group for row in rows for op in row.timeline}) > 1
    width = LABEL + 120 + CELL * max((len(r.timeline) for r in rows), default=1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{18 * len(rows) + 10}">']
    for y, row in enumerate(rows):
        top = 4 + 18 * y
        color = "#b00" if row.rank in culprits else "#222"
        host = f" {row.host[:12]}" if row.host else ""
        parts.append(f'<text x="2" y="{top + 11}" fill="{color}">rank {row.rank}{html.escape(host)}</text>')
        for x, op in enumerate(row.timeline):
            fill = "#9c9" if op.done else "#f96"
            title = html.escape(f"{op.op} seq {op.seq} group {op.group} {'done' if op.done else 'NOT FINISHED'}")
            label = html.escape(_cell_label(op.op, op.seq, op.group, several_groups))
            parts.append(f'<rect x="{LABEL + CELL * x}" y="{top}" width="{CELL - 2}" height="14" fill="{fill}">'
                         f'<title>{title}</title></rect>')
            parts.append(f'<text x="{LABEL + 2 + CELL * x}" y="{top + 11}">{label}</text>')
        end = LABEL + CELL * len(row.timeline)
        parts.append(f'<path d="M{end} {top}v14" stroke="{color}" stroke-width="2"/>')
        if row.state != "in_collective":
            parts.append(f'<text x="{end + 4}" y="{top + 11}" fill="{color}">{html.escape(row.state)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(summary: Summary) -> str:
    d = summary
    cls = "ok" if d.verdict is Verdict.NO_HANG else "bad"
    shown = display_rows(d, MAX_ROWS)
    embedded_json = json.dumps(d.to_dict()).replace("</", "<\\/")  # a "</script>" in a path cannot end the tag
    rows = "".join(
        f'<tr class="{"culprit" if r.rank in d.culprit_ranks else ""}"><td>{r.rank}</td><td>{html.escape(r.host or "-")}'
        f"</td><td>{html.escape(r.state)}</td><td>{html.escape(r.detail)}</td><td><code>{html.escape(r.location or '-')}"
        "</code></td></tr>" for r in shown)
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>lightning-ncclx hang summary</title>"
        f"<style>{_CSS}</style></head><body>"
        f'<h1 class="{cls}">{html.escape(d.headline)}</h1>'
        f"<pre>{html.escape(render_text(d))}</pre>"
        "<h2>Last collectives per rank</h2><p>green: finished, orange: not finished; the bar marks where each "
        "rank stopped; culprits in red. Cells: [g&lt;group&gt;] op and sequence id (AR all_reduce, AG all_gather, "
        "RS reduce_scatter, BC broadcast, BAR barrier, A2A all_to_all); hover for details.</p>"
        f"{_timeline_svg(shown, set(d.culprit_ranks))}"
        "<h2>Ranks</h2><table><tr><th>rank</th><th>host</th><th>state</th><th>detail</th><th>location</th></tr>"
        f"{rows}</table>"
        f'<script type="application/json" id="summary">{embedded_json}</script>'
        "</body></html>\n"
    )
