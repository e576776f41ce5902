"""The report's timeline as data: columns are (group, sequence id) in time order, centred on the
divergence, with every shown rank's stop point kept; ranks whose visible cells and state are the
same share a row, labelled by every rank it stands for (a 1024-rank job fits on one screen).
Pure; rendering is in ``html.py``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lightning_ncclx.analysis.model import RankRow, Summary, TimelineOp
from lightning_ncclx.analysis.wording import ranks_label
from lightning_ncclx.report.group_names import GroupNames
from lightning_ncclx.report.text import display_rows

MAX_COLUMNS = 12
BEFORE_DIVERGENCE = 6
AFTER_DIVERGENCE = 2
MAX_GRID_ROWS = 24

Key = tuple[str, int]


@dataclass(frozen=True)
class Column:
    group: str
    seq: int
    group_label: str
    short_group: str
    divergence: bool = False
    gap: bool = False


@dataclass(frozen=True)
class Cell:
    status: str  # done | open | none
    op: str = ""
    stop: bool = False


@dataclass(frozen=True)
class GridRow:
    label: str
    title: str
    culprit: bool
    cells: tuple[Cell, ...]
    state: str
    where: str
    culprit_stop_column: int | None = None


@dataclass(frozen=True)
class Grid:
    columns: tuple[Column, ...]
    rows: tuple[GridRow, ...]
    group_labels: Mapping[str, str] = field(default_factory=dict)
    hidden_rows: int = 0


def _choose(order: list[Key], divergence: Key | None, stops: list[Key]) -> list[Key]:
    index = {k: i for i, k in enumerate(order)}
    centre = index.get(divergence, len(order) - 1) if divergence is not None else len(order) - 1
    chosen: list[Key] = [order[centre]] if order else []
    for k in stops:  # culprits' stops come first in ``stops``
        if k not in chosen and len(chosen) < MAX_COLUMNS:
            chosen.append(k)
    nearby = sorted(range(max(0, centre - BEFORE_DIVERGENCE), min(len(order), centre + AFTER_DIVERGENCE + 1)),
                    key=lambda i: (abs(i - centre), i > centre))
    for i in nearby:
        if order[i] not in chosen and len(chosen) < MAX_COLUMNS:
            chosen.append(order[i])
    return sorted(chosen, key=index.__getitem__)


def _short_state(row: RankRow) -> str:
    detail = row.detail
    if row.state == "in_collective":
        return "waiting in " + detail.removeprefix("in ").split(" [")[0]
    if row.state == "outside_collective":
        if ", " in detail and ":" in detail:
            return "outside collectives: " + detail.split(", ", 1)[1].split(":")[0]
        return "outside collectives, in its code"
    short = {"process_gone": "process gone", "no_answer": "alive, no dump", "no_dump": "no dump"}
    return short.get(row.state, row.state)


def build_grid(summary: Summary, limit: int = 256) -> Grid:
    """Columns from the ``limit`` ranks of the rank table (culprits first); rows from every rank."""
    rows = display_rows(summary, limit)
    names = GroupNames(summary)
    first_seen: dict[Key, int] = {}
    for row in rows:
        for op in row.timeline:
            key = (op.group, op.seq)
            first_seen[key] = min(first_seen.get(key, op.time_ns), op.time_ns)
    order = sorted(first_seen, key=lambda k: (first_seen[k], k[0], k[1]))
    pg = summary.process_group
    divergence = (pg.name, summary.collective_seq_id) if pg is not None and summary.collective_seq_id is not None \
        else None
    divergence = divergence if divergence in first_seen else None
    culprits = set(summary.culprit_ranks)
    last = {row.rank: (row.timeline[-1].group, row.timeline[-1].seq) for row in summary.per_rank if row.timeline}
    stops = [last[r.rank] for r in rows if r.rank in culprits and r.rank in last]
    stops += [last[r.rank] for r in rows if r.rank not in culprits and r.rank in last]
    chosen = _choose(order, divergence, list(dict.fromkeys(stops)))
    index = {k: i for i, k in enumerate(order)}
    several = len({k[0] for k in chosen}) > 1
    labels = {group: names.title(group) for group in {k[0] for k in chosen}}
    columns: list[Column] = []
    for i, key in enumerate(chosen):
        if i and index[key] != index[chosen[i - 1]] + 1:
            columns.append(Column("", 0, "", "", gap=True))
        columns.append(Column(key[0], key[1], labels.get(key[0], key[0]), f"{key[0]}:" if several else "",
                              divergence=key == divergence))
    grid_rows = _rows(summary.per_rank, columns, culprits, last, names)
    return Grid(tuple(columns), tuple(grid_rows[:MAX_GRID_ROWS]), labels, max(0, len(grid_rows) - MAX_GRID_ROWS))


def _rows(rows: tuple[RankRow, ...], columns: list[Column], culprits: set[int], last: Mapping[int, Key],
          names: GroupNames) -> list[GridRow]:
    merged: dict[tuple, list[RankRow]] = {}
    cells_of: dict[int, tuple[Cell, ...]] = {}
    shared: dict[tuple, Cell] = {}  # every rank's grid: thousands of rows, a handful of distinct cells
    for row in rows:
        ops: dict[Key, TimelineOp] = {(op.group, op.seq): op for op in row.timeline}
        cells = []
        for col in columns:
            op = ops.get((col.group, col.seq)) if not col.gap else None
            key = ("none",) if op is None else ("done" if op.done else "open", op.op,
                                                 last.get(row.rank) == (col.group, col.seq))
            cells.append(shared.get(key) or shared.setdefault(key, Cell(*key)))
        cells_of[row.rank] = tuple(cells)
        key = ("culprit", row.rank) if row.rank in culprits else (cells_of[row.rank], row.state, _short_state(row))
        merged.setdefault(key, []).append(row)
    out = []
    for members in sorted(merged.values(), key=lambda m: (m[0].rank not in culprits, min(r.rank for r in m))):
        first = members[0]
        culprit = first.rank in culprits
        hosts = sorted({m.host for m in members if m.host})
        label = ranks_label(m.rank for m in members)
        host = hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts" if hosts else ""
        cells = cells_of[first.rank]
        stop = next((i for i, c in enumerate(cells) if c.stop), None)
        where = names.rewrite(first.detail) + (f" at {first.location}" if first.location else "")
        shown_host = f" ({host})" if " hosts" in host else f" {host}" if host else ""
        out.append(GridRow(label + shown_host, f"{label}{' on ' + host if host else ''}: {where}",
                           culprit, cells, names.rewrite(_short_state(first)), where,
                           stop if culprit else None))
    return out
