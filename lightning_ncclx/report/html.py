"""A one-screen, self-contained HTML report (inline CSS and script, no network).

At 1400x900 the top of the page holds the verdict, the hang kind and what to do next, the
culprit's code line, and a timeline of the collectives aligned by (group, sequence id) and
centred on the divergence, so that every rank's stop point is visible without scrolling.
Details (every finding, the rank table, the text report, the JSON) follow below. Every string
from the dumps is escaped; the embedded JSON cannot close its ``<script>`` tag.
"""

from __future__ import annotations

import html
import json

import lightning_ncclx.analysis.rank_classes as tables
import lightning_ncclx.analysis.rank_sets as rank_sets
from lightning_ncclx.analysis.kind import classify
from lightning_ncclx.analysis.model import RankRow, Summary, Verdict
from lightning_ncclx.layout import RANK_DETAIL_FILE
from lightning_ncclx.report.group_names import GroupNames
from lightning_ncclx.report.text import display_rows, render_text
from lightning_ncclx.report.timeline import Grid, build_grid

MAX_ROWS = 256
"""Rank rows in the table below the fold (culprits always among them); past this many ranks the
table lists classes of alike ranks instead (as many as ``summary.json`` has example rows)."""

_OP_ABBREVIATIONS = {"all_reduce": "AR", "allreduce": "AR", "all_gather": "AG", "allgather": "AG",
                     "_allgather_base": "AG", "all_gather_into_tensor": "AG", "reduce_scatter": "RS",
                     "_reduce_scatter_base": "RS", "reduce_scatter_tensor": "RS", "broadcast": "BC", "barrier": "BAR",
                     "all_to_all": "A2A", "alltoall": "A2A", "alltoall_base": "A2A", "reduce": "RED",
                     "gather": "GA", "scatter": "SC", "send": "SEND", "recv": "RECV"}

_CSS = """*{box-sizing:border-box}body{font:13px/1.35 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1400px;margin:0 auto;padding:10px 16px}
#verdict{margin:0 0 8px;padding:8px 12px;border-radius:6px;background:#fde8e8;border-left:6px solid #b00020}
#verdict.ok{background:#e6f4ea;border-color:#137333}
#recovered{margin:0 0 8px;padding:8px 12px;border-radius:6px;background:#e6f4ea;border-left:6px solid #137333;font-weight:600}
#verdict h1{font-size:17px;margin:0 0 2px;overflow-wrap:anywhere}#verdict p{margin:0;overflow-wrap:anywhere}
.kind{display:inline-block;font:600 12px monospace;padding:1px 6px;border-radius:4px;background:#b00020;color:#fff;
margin-right:6px}.ok .kind{background:#137333}
.top{display:grid;grid-template-columns:440px minmax(0,1fr);gap:14px;align-items:start}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 10px;margin-bottom:10px;min-width:0}
h2{font-size:13px;margin:0 0 5px;text-transform:uppercase;letter-spacing:.04em;color:#555}
ol{margin:0;padding-left:18px}li{margin-bottom:3px;overflow-wrap:anywhere}
code,pre{font:12px/1.35 ui-monospace,monospace;overflow-wrap:anywhere;white-space:pre-wrap}
.restart{font-weight:600}.restart.do_not_restart{color:#b00020}.restart.restart_excluding_hosts{color:#a05a00}
.grid{display:grid;gap:2px;font:11px ui-monospace,monospace;overflow:hidden}
.grid>div{height:19px;line-height:19px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;padding:0 3px}
.hd{color:#555;font-size:10px;text-align:center}.hd.div{color:#b00020;font-weight:700}
.lbl.culprit,.st.culprit{color:#b00020;font-weight:700}
.c{text-align:center;border-radius:3px;cursor:pointer}.done{background:#a8d5a2}.open{background:#f5a25d}
.none{background:#f0f0f0}.gap{background:none;text-align:center;color:#999}
.divcol{outline:2px solid #b00020;outline-offset:-1px}.stop{box-shadow:inset -4px 0 0 #1d1d1f}
.culprit.stop{box-shadow:inset -4px 0 0 #b00020}.st{color:#333}
#detail{margin-top:6px;min-height:2.6em;color:#333;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%}
td,th{border:1px solid #ddd;padding:2px 5px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
tr.culprit{background:#fde8e8}.legend{color:#666;font-size:11px;margin:4px 0 0}"""

_SCRIPT = """document.querySelectorAll('[data-d]').forEach(function(e){e.addEventListener('click',function(){
document.getElementById('detail').textContent=e.getAttribute('data-d');});});"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _abbreviation(op: str) -> str:
    return _OP_ABBREVIATIONS.get(op.split(" ")[0], op[:4].upper())


def _timeline(grid: Grid) -> str:
    if not grid.columns:
        return "<p>No collective was recorded by any dumped rank.</p>"
    template = f"grid-template-columns:150px repeat({len(grid.columns)},minmax(34px,52px)) minmax(90px,1fr)"
    parts = [f'<div class="grid" style="{template}">', "<div></div>"]
    for col in grid.columns:
        if col.gap:
            parts.append('<div class="hd gap" title="collectives left out">&#8943;</div>')
            continue
        cls = "hd div" if col.divergence else "hd"
        parts.append(f'<div class="{cls}" title="{_e(col.group_label)} seq {col.seq}">{_e(col.short_group)}'
                     f"{col.seq}</div>")
    parts.append('<div class="hd">where it stopped</div>')
    marked = False  # one culprit stop cell carries the id
    for row in grid.rows:
        culprit = " culprit" if row.culprit else ""
        parts.append(f'<div class="lbl{culprit}" title="{_e(row.title)}">{_e(row.label)}</div>')
        for i, col in enumerate(grid.columns):
            if col.gap:
                parts.append('<div class="gap">&#8943;</div>')
                continue
            cell = row.cells[i]
            classes = ["c", cell.status] + (["divcol"] if col.divergence else []) + (["stop"] if cell.stop else [])
            classes += ["culprit"] if row.culprit and cell.stop else []
            ident = ' id="culprit-stop"' if row.culprit_stop_column == i and not marked else ""
            marked = marked or bool(ident)
            text = _abbreviation(cell.op) if cell.op else ""
            status = {"done": "finished", "open": "NOT finished"}.get(cell.status, "not recorded")
            detail = (f"{row.label}: {cell.op} seq {col.seq} in {col.group_label}: {status}" if cell.op
                      else f"{row.label}: no entry for seq {col.seq} in {col.group_label}")
            parts.append(f'<div{ident} class="{" ".join(classes)}" title="{_e(detail)}" data-d="{_e(detail)}">'
                         f"{_e(text)}</div>")
        ident = ' id="culprit-stop"' if row.culprit and row.culprit_stop_column is None and not marked else ""
        marked = marked or bool(ident)
        parts.append(f'<div{ident} class="st{culprit}" title="{_e(row.where)}" '
                     f'data-d="{_e(row.label + ": " + row.where)}">{_e(row.state)}</div>')
    parts.append("</div>")
    several = sorted({c.group for c in grid.columns if not c.gap})
    if len(several) > 1:
        parts.append('<p class="legend">groups: ' + "; ".join(f"{_e(g)}: {_e(grid.group_labels.get(g, g))}"
                                                                for g in several) + "</p>")
    if grid.hidden_rows:
        parts.append(f'<p class="legend">{grid.hidden_rows} more row(s) in the rank table below.</p>')
    parts.append('<p class="legend">green finished, orange entered and not finished, grey not recorded; the bar '
                 "ends where each rank stopped; the red column is where the ranks diverge. Header: group and sequence "
                 "id (AR all_reduce, AG all_gather, RS reduce_scatter, BC broadcast, BAR barrier). Click a cell:</p>"
                 '<div id="detail" class="legend"></div>')
    return "".join(parts)


def _culprit_panel(d: Summary, names: GroupNames) -> str:
    if not d.findings:
        return ""
    head = d.findings[0]
    items = []
    for c in head.culprit_states[:4]:
        host = f" on {d.hosts[c.rank]}" if c.rank in d.hosts else ""
        items.append(f"<li><b>rank {c.rank}{_e(host)}</b>: {_e(names.rewrite(c.detail))}"
                     + (f"<br><code>{_e(c.location)}</code>" if c.location else "") + "</li>")
    waiting = next((r for r in d.per_rank if r.rank in set(head.waiting_ranks) and r.location), None)
    if waiting is not None:
        items.append(f"<li>waiting rank {waiting.rank}: {_e(names.rewrite(waiting.detail))}"
                     f"<br><code>{_e(waiting.location)}</code></li>")
    items += [f"<li><code>{_e(e)}</code></li>" for e in head.evidence[:2]]
    return f"<section><h2>Culprit</h2><ol>{''.join(items)}</ol></section>"


def _rank_table(rows: tuple[RankRow, ...], culprits: set[int], names: GroupNames) -> str:
    body = "".join(
        f'<tr class="{"culprit" if r.rank in culprits else ""}"><td>{r.rank}</td><td>{_e(r.host or "-")}</td>'
        f"<td>{_e(r.state)}</td><td>{_e(names.rewrite(r.detail))}</td><td><code>{_e(r.location or '-')}</code></td></tr>"
        for r in rows)
    return ("<section><h2>Ranks</h2><table><tr><th>rank</th><th>host</th><th>state</th><th>detail</th>"
            f"<th>location</th></tr>{body}</table></section>")


def _class_table(d: Summary, names: GroupNames) -> str:
    """Past :data:`MAX_ROWS` rows, the ranks grouped by what their rows say (the odd ones
    first); every rank's own row is in the per-rank detail file."""
    culprits = set(d.culprit_ranks)
    body = []
    for c in tables.classes(d.per_rank, tables.row_key, tables.row_class, ranges=True, limit=tables.MAX_ROWS):
        ranks = rank_sets.decode(c["ranks"])
        hosts = {h for h in map(d.hosts.get, ranks) if h}
        host = next(iter(hosts)) if len(hosts) == 1 else f"{len(hosts)} hosts" if hosts else "-"
        culprit = "culprit" if culprits.intersection(ranks) else ""
        detail = names.rewrite(c["detail"]) if "detail" in c else f"{c['more_classes']} more classes"
        body.append(f'<tr class="{culprit}"><td>{_e(c["ranks"])}</td><td>{c["count"]}</td><td>{_e(host)}</td>'
                    f"<td>{_e(c.get('state', '-'))}</td><td>{_e(detail)}</td>"
                    f"<td><code>{_e(c.get('location') or '-')}</code></td></tr>")
    return (f"<section><h2>Ranks, grouped ({len(d.per_rank)} ranks)</h2><table><tr><th>ranks</th><th>count</th>"
            "<th>host</th><th>state</th><th>detail</th><th>location</th></tr>" + "".join(body) + "</table>"
            f'<p class="legend">Ranks whose rows agree share a line, the fewest first. Every rank\'s own row: '
            f"{_e(RANK_DETAIL_FILE)} beside summary.json.</p></section>")


def embed_json(data: object) -> str:
    """JSON safe inside ``<script>``: no ``<``, ``>`` or ``&`` survives (a path holding
    ``</script>`` or ``<!--`` cannot end or confuse the tag); ``json.loads`` reads it back as is."""
    return (json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_html(summary: Summary) -> str:
    d = summary
    c = d.classification or classify(d)
    ok = d.verdict is Verdict.NO_HANG and c.kind.value == "no_hang"
    grid = build_grid(d)
    names = GroupNames(d)
    verdict = c.kind.value if d.verdict is Verdict.NO_HANG and not ok else d.verdict.value  # not "HANG: no_hang"
    title = (f"{'NO HANG' if ok else 'HANG'}: {verdict}"
             + (f", culprit rank(s) {', '.join(map(str, d.culprit_ranks[:8]))}" if d.culprit_ranks else ""))
    advice = "".join(f"<li>{_e(a)}</li>" for a in c.advice) or "<li>nothing to do</li>"
    exclude = f" (exclude {_e(','.join(c.hosts_to_exclude))})" if c.hosts_to_exclude else ""
    restart = (f'<p class="restart {_e(c.restart.value)}">restart: {_e(c.restart.value)}{exclude}</p>'
               f"<p>{_e(c.restart_reason)}</p>")
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>lightning-ncclx: '
        f"{_e(c.kind.value)}</title><style>{_CSS}</style></head><body><main>"
        + (f'<div id="recovered" role="status">RECOVERED: {_e(d.recovery.message)}</div>' if d.recovery else "")
        + f'<div id="verdict" class="{"ok" if ok else "bad"}"><h1><span class="kind">{_e(c.kind.value)}</span>'
        f"{_e(title)}</h1><p>{_e(c.reason)}</p></div>"
        '<div class="top"><div>'
        f"<section><h2>What to do next</h2><ol>{advice}</ol>{restart}</section>"
        f"{_culprit_panel(d, names)}</div>"
        f'<section id="timeline"><h2>Collectives per rank, aligned by group and sequence id</h2>{_timeline(grid)}'
        "</section></div>"
        f"<section><h2>Full report</h2><pre>{_e(render_text(d))}</pre></section>"
        + (_rank_table(display_rows(d, MAX_ROWS), set(d.culprit_ranks), names) if len(d.per_rank) <= MAX_ROWS
           else _class_table(d, names))
        + f'<script type="application/json" id="summary">{embed_json(d.to_dict())}</script>'
        f"<script>{_SCRIPT}</script>"
        "</main></body></html>\n"
    )
