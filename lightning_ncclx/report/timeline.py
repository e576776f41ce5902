"""The report's timeline as data: columns are (group, sequence id) in time order, centred on the
divergence, with every shown rank's stop point kept; ranks whose visible cells and state are the
same share a row (a 1024-rank job fits on one screen). Pure; rendering is in ``html.py``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lightning_ncclx.analysis.model import RankRow, Summary, TimelineOp
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


def rank_list(ranks: list[int] | tuple[int, ...]) -> str:
    """``0-3, 7``: runs of consecutive ranks compressed."""
    ranks = sorted(set(ranks))
    runs: list[str] = []
    start = prev = None
    for r in ranks + [None]:  # type: ignore[list-item]
        if r is not None and prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    return ", ".join(runs)


def group_labels(summary: Summary, rows: tuple[RankRow, ...]) -> dict[str, str]:
    """group name -> its description, or its ranks when torch calls it "undefined" (or nothing)."""
    members: dict[str, set[int]] = {}
    for row in rows:
        for op in row.timeline:
            members.setdefault(op.group, set()).add(row.rank)
    refs = {f.group.name: f.group for f in summary.findings}
    if summary.process_group is not None:
        refs.setdefault(summary.process_group.name, summary.process_group)
    labels = {}
    for name in sorted(set(members) | set(refs)):
        ref = refs.get(name)
        desc = ref.desc if ref is not None else ""
        if desc and desc != "undefined":
            labels[name] = desc
        else:
            ranks = ref.ranks if ref is not None and ref.membership_known else tuple(sorted(members.get(name, ())))
            labels[name] = f"ranks {rank_list(ranks)}" if ranks else f"group {name}"
    return labels


def name_groups(text: str, labels: Mapping[str, str]) -> str:
    """Replace torch's "group 1 (undefined)" with the group's ranks."""
    for name, label in labels.items():
        text = text.replace(f"group {name} (undefined)", f"group {name} ({label})")
    return text


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
    rows = display_rows(summary, limit)
    labels = group_labels(summary, rows)
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
    last = {row.rank: (row.timeline[-1].group, row.timeline[-1].seq) for row in rows if row.timeline}
    stops = [last[r.rank] for r in rows if r.rank in culprits and r.rank in last]
    stops += [last[r.rank] for r in rows if r.rank not in culprits and r.rank in last]
    chosen = _choose(order, divergence, list(dict.fromkeys(stops)))
    index = {k: i for i, k in enumerate(order)}
    several = len({k[0] for k in chosen}) > 1
    columns: list[Column] = []
    for i, key in enumerate(chosen):
        if i and index[key] != index[chosen[i - 1]] + 1:
            columns.append(Column("", 0, "", "", gap=True))
        columns.append(Column(key[0], key[1], labels.get(key[0], key[0]), f"{key[0]}:" if several else "",
                              divergence=key == divergence))
    grid_rows = _rows(rows, columns, culprits, last, labels)
    return Grid(tuple(columns), tuple(grid_rows[:MAX_GRID_ROWS]), labels, max(0, len(grid_rows) - MAX_GRID_ROWS))


def _rows(rows: tuple[RankRow, ...], columns: list[Column], culprits: set[int], last: Mapping[int, Key],
          labels: Mapping[str, str]) -> list[GridRow]:
    merged: dict[tuple, list[RankRow]] = {}
    cells_of: dict[int, tuple[Cell, ...]] = {}
    for row in rows:
        ops: dict[Key, TimelineOp] = {(op.group, op.seq): op for op in row.timeline}
        cells = []
        for col in columns:
            op = ops.get((col.group, col.seq)) if not col.gap else None
            if op is None:
                cells.append(Cell("none"))
            else:
                cells.append(Cell("done" if op.done else "open", op.op, last.get(row.rank) == (col.group, col.seq)))
        cells_of[row.rank] = tuple(cells)
        key = ("culprit", row.rank) if row.rank in culprits else (cells_of[row.rank], row.state, _short_state(row))
        merged.setdefault(key, []).append(row)
    out = []
    for members in merged.values():
        first = members[0]
        culprit = first.rank in culprits
        ranks = [m.rank for m in members]
        hosts = sorted({m.host for m in members if m.host})
        label = f"rank {first.rank}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"
        host = hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts" if hosts else ""
        cells = cells_of[first.rank]
        stop = next((i for i, c in enumerate(cells) if c.stop), None)
        where = name_groups(first.detail, labels) + (f" at {first.location}" if first.location else "")
        shown_host = f" ({host})" if " hosts" in host else f" {host}" if host else ""
        out.append(GridRow(label + shown_host, f"{label}{' on ' + host if host else ''}: {where}",
                           culprit, cells, name_groups(_short_state(first), labels), where,
                           stop if culprit else None))
    out.sort(key=lambda r: (not r.culprit, _first_rank(r.label)))
    return out


def _first_rank(label: str) -> int:
    digits = label.split(" ")[1].split("-")[0].split(",")[0]
    return int(digits) if digits.isdigit() else 0
