"""Plain-text and Markdown reports: the verdict in the first lines, details after."""

from __future__ import annotations

from collections import Counter

from lightning_ncclx.analysis.kind import classify
from lightning_ncclx.analysis.model import Finding, RankRow, Summary, Verdict
from lightning_ncclx.analysis.wording import group_label
from lightning_ncclx.report.escape import escaped, markdown_safe, terminal_safe
from lightning_ncclx.report.group_names import GroupNames


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    ranks = list(ranks)
    return ", ".join(map(str, ranks)) if len(ranks) <= 16 else f"{', '.join(map(str, ranks[:14]))}, ... ({len(ranks)})"


def _finding_lines(f: Finding, bullet: str = "  ") -> list[str]:
    g = f.group
    lines = [f"{bullet}[{f.kind.value}] {f.message}",
             f"{bullet}  {group_label(g)} ranks [{_ranks(g.ranks)}]  seq {f.seq}  op {f.op}"
             + (f"  confidence {f.confidence}" if f.confidence != "high" else "")]
    for c in f.culprit_states:
        lines.append(f"{bullet}  rank {c.rank}: {c.state} - {c.detail}" + (f" at {c.location}" if c.location else ""))
    for e in f.evidence:
        lines.append(f"{bullet}  {e}")
    return lines


def _location_lines(d: Summary, most: int = 8) -> list[str]:
    """Where the dumps were read from, per host (several hosts: node-local folders gathered)."""
    if not d.dump_locations or (len(d.dump_locations) == 1 and not d.hosts):
        return []
    lines = ["dumps by host:"]
    for host, folders in list(sorted(d.dump_locations.items()))[:most]:
        ranks = sorted(r for r, h in d.hosts.items() if h == host)
        lines.append(f"  {host} (ranks {_ranks(ranks) or '?'}): {', '.join(folders)}")
    if len(d.dump_locations) > most:
        lines.append(f"  ... {len(d.dump_locations) - most} more hosts in the JSON report")
    return lines


def display_rows(summary: Summary, limit: int) -> tuple[RankRow, ...]:
    """At most ``limit`` per-rank rows in rank order, always including every culprit's (in a
    1024-rank job the culprit may be rank 700)."""
    culprits = set(summary.culprit_ranks)
    chosen = [r for r in summary.per_rank if r.rank in culprits][:limit]
    chosen += [r for r in summary.per_rank if r.rank not in culprits][:limit - len(chosen)]
    return tuple(sorted(chosen, key=lambda r: r.rank))


def kind_lines(summary: Summary) -> list[str]:
    """The hang kind with its reason, then what to do next and whether to restart."""
    c = summary.classification or classify(summary)
    lines = [f"KIND: {c.kind.value} - {c.reason}"]
    lines += [f"  next: {a}" for a in c.advice]
    exclude = f" (exclude: {','.join(c.hosts_to_exclude)})" if c.hosts_to_exclude else ""
    lines.append(f"  restart: {c.restart.value}{exclude} - {c.restart_reason}")
    return lines


_IGNORED_KINDS = (("over the", "too large"), ("not a regular file", "not regular files"),
                  ("symlink out", "symlinks out of the folder"), ("deeper than", "too deep"),
                  ("zstd", "compressed"))


def input_tally(d: Summary) -> str:
    """One line: how many dumps were read (by format), and how many files were skipped, by why."""
    formats = Counter(i.fmt or "?" for i in d.inputs)
    read = ", ".join(f"{n} {fmt}" for fmt, n in sorted(formats.items()))
    line = f"inputs: {len(d.inputs)} dump{'s' if len(d.inputs) != 1 else ''} read" + (f" ({read})" if read else "")
    if d.ignored:
        kinds = Counter(next((words for key, words in _IGNORED_KINDS if key in u.why), "not dumps") for u in d.ignored)
        why = ", ".join(f"{n} {k}" for k, n in kinds.most_common()) if len(kinds) > 1 else next(iter(kinds))
        line += f"; {len(d.ignored)} file{'s' if len(d.ignored) != 1 else ''} ignored ({why})"
    if d.duplicates:
        line += f"; {len(d.duplicates)} duplicate{'s' if len(d.duplicates) != 1 else ''} (newest kept)"
    if d.unreadable:
        line += f"; {len(d.unreadable)} unreadable"
    return line


def render_text(summary: Summary) -> str:
    """A report a person reads in ten seconds; plain ``str`` (no markup), fit for a log. Text
    from the dumps is escaped (control characters, ESC, lone surrogates)."""
    d = escaped(summary, terminal_safe)
    names = GroupNames(d)
    out = [f"RECOVERED: {d.recovery.message}"] if d.recovery is not None else []
    out += kind_lines(d)
    kind = (d.classification or classify(d)).kind.value
    if d.verdict is Verdict.NO_HANG:
        out.append("NO HANG FOUND: " + d.headline)
    elif not d.findings:  # every rank agrees on its collectives, and yet the job does not move
        out.append(f"HANG: {kind} - no rank is missing from a collective; no culprit rank")
    else:
        out.append(f"HANG: {d.verdict.value} - culprit rank(s) {_ranks(d.culprit_ranks)}")
        if d.process_group:
            g = d.process_group
            out.append(f"  collective: {d.op} seq {d.collective_seq_id} in {group_label(g)}")
        out.append(f"  waiting ranks: {_ranks(d.waiting_ranks) or 'none'}")
        for c in d.findings[0].culprit_states:
            host = f" on {d.hosts[c.rank]}" if c.rank in d.hosts else ""
            out.append(f"  rank {c.rank}{host}: {c.detail}" + (f"\n    at {c.location}" if c.location else ""))
        out.extend(f"  {e}" for e in d.findings[0].evidence if e.startswith("deadlock across groups"))
        out.extend(f"  rank {w.rank} waits on rank(s) {_ranks(w.on)}: in {w.op}" for w in d.findings[0].waits)
    out.append("")
    out.append(f"ranks seen: {len(d.ranks_seen)}" + (f"; missing: {_ranks(d.ranks_missing)}" if d.ranks_missing else ""))
    out.append(input_tally(d))
    out.extend(_location_lines(d))
    if d.findings:
        out.append("findings (likely root cause first):")
        for f in d.findings[:20]:
            out.extend(_finding_lines(f))
        if len(d.findings) > 20:
            out.append(f"  ... {len(d.findings) - 20} more in the JSON report")
    for n in d.notes:
        out.append(f"note: {n}")
    if d.stragglers:
        out.append("arrival skew (who enters collectives last):")
        for s in d.stragglers[:5]:
            out.append(f"  rank {s.rank} in group {s.group} ({names.title(s.group, s.desc)}): "
                       f"median {s.median_late_ms:.2f} ms late, p95 {s.p95_late_ms:.2f} ms, last in {s.last_fraction:.0%} of {s.samples}")
    if d.duplicates:
        out.append("duplicate dumps of one rank (the newest entries kept):")
        out.extend(f"  rank {x.rank} ({x.backend}): kept {x.kept}, dropped {x.dropped}" for x in d.duplicates[:20])
    if d.unreadable:
        out.append("unreadable files:")
        out.extend(f"  {u.path}: {u.why}" for u in d.unreadable[:50])
        if len(d.unreadable) > 50:
            out.append(f"  ... {len(d.unreadable) - 50} more in the JSON report")
    return names.rewrite("\n".join(out)) + "\n"


def render_markdown(summary: Summary) -> str:
    """Markdown for a ticket; text from the dumps is escaped (no markup or HTML gets through)."""
    d = escaped(summary, markdown_safe)
    names = GroupNames(d)
    c = d.classification or classify(d)
    out = [f"# Hang summary: `{d.verdict.value}`", ""]
    if d.recovery is not None:
        out += [f"> **Recovered**: {d.recovery.message}", ""]
    out += [f"**Hang kind: `{c.kind.value}`** - {c.reason}", ""]
    out += [f"- next: {a}" for a in c.advice] + [f"- restart: `{c.restart.value}` - {c.restart_reason}", ""]
    out += [f"**{d.headline}**", "", input_tally(d), ""]
    if d.findings:
        g = d.process_group
        out += ["| | |", "|---|---|", f"| culprit ranks | {_ranks(d.culprit_ranks)} |",
                f"| collective | `{d.op}` seq {d.collective_seq_id} |",
                f"| process group | {group_label(g)} ranks {_ranks(g.ranks)} |" if g else "| process group | - |",
                f"| waiting ranks | {_ranks(d.waiting_ranks) or '-'} |", ""]
    if d.findings:
        out += ["## Findings (likely root cause first)", ""]
        for f in d.findings[:50]:
            out += [f"- **{f.kind.value}** {f.message}"]
            out += [f"  - rank {c.rank}: {c.state} - {c.detail}" + (f" at {c.location}" if c.location else "")
                    for c in f.culprit_states]
            out += [f"  - {e}" for e in f.evidence]
            out += [f"  - rank {w.rank} waits on rank(s) {_ranks(w.on)}: in {w.op}" for w in f.waits]
        out.append("")
    if d.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in d.notes] + [""]
    out += ["## Ranks", "", "| rank | host | state | detail | location |", "|---|---|---|---|---|"]
    out += [f"| {r.rank} | {r.host or '-'} | {r.state} | {r.detail} | {r.location or '-'} |"
            for r in display_rows(d, 256)]
    out.append("")
    if d.stragglers:
        out += ["## Arrival skew", "", "| rank | group | median late (ms) | p95 late (ms) | last |", "|---|---|---|---|---|"]
        out += [f"| {s.rank} | group {s.group} ({names.title(s.group, s.desc)}) | {s.median_late_ms:.2f} | "
                f"{s.p95_late_ms:.2f} | {s.last_fraction:.0%} |"
                for s in d.stragglers]
        out.append("")
    if d.unreadable:
        out += ["## Unreadable files", ""] + [f"- {u.path}: {u.why}" for u in d.unreadable[:200]] + [""]
    return names.rewrite("\n".join(out))
