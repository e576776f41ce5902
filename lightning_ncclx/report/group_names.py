"""Every report form names a process group the same way: by its description, or, where torch
gave it none ("undefined"), by the ranks it stands for (``analysis.wording.group_title``).

The analysis writes some of its prose with torch's own description (a rank's detail says ``in
all_reduce (seq 3) in group 1 (undefined) [scheduled]``); :meth:`GroupNames.rewrite` puts the
group's ranks there in every rendered form.
"""

from __future__ import annotations

import re

from lightning_ncclx.analysis.model import Summary
from lightning_ncclx.analysis.wording import UNNAMED_DESCS, group_title

# "group <name> (" followed by a description that names nothing, then "," or ")".
_UNNAMED = re.compile(r"group (\S+) \((?:undefined)?(?=[,)])")


class GroupNames:
    """The title of each group a summary mentions: its description where the findings, the verdict
    or the arrival-skew table give one; its members from what declared them (the findings' and
    the verdict's groups) or else from the ranks whose timelines hold it."""

    def __init__(self, summary: Summary) -> None:
        self._summary = summary
        self._declared: dict[str, tuple[str, tuple[int, ...]]] = {}
        for ref in [f.group for f in summary.findings] + [summary.process_group]:
            if ref is not None and ref.membership_known:
                self._declared.setdefault(ref.name, (ref.desc, ref.ranks))
        self._descs = {s.group: s.desc for s in summary.stragglers if s.desc not in UNNAMED_DESCS}
        self._descs.update((name, desc) for name, (desc, _) in self._declared.items() if desc not in UNNAMED_DESCS)
        self._seen: dict[str, set[int]] | None = None

    def _members_seen(self, name: str) -> tuple[int, ...]:
        if self._seen is None:
            self._seen = {}
            for row in self._summary.per_rank:
                for op in row.timeline:
                    self._seen.setdefault(op.group, set()).add(row.rank)
        return tuple(sorted(self._seen.get(name, ())))

    def title(self, name: str, desc: str = "") -> str:
        """``tp``, or ``ranks 0-2`` for a group without a description."""
        desc = desc if desc not in UNNAMED_DESCS else self._descs.get(name, "")
        return desc if desc not in UNNAMED_DESCS else self.members_title(name)

    def members_title(self, name: str) -> str:
        """``ranks 0-2``: the group's members, never text from a dump (safe in every form)."""
        ranks = self._declared.get(name, ("", ()))[1] or self._members_seen(name)
        return group_title("", ranks)

    def rewrite(self, text: str) -> str:
        """``group 1 (undefined)`` -> ``group 1 (ranks 0-2)`` wherever the prose has it."""
        return _UNNAMED.sub(lambda m: f"group {m[1]} ({self.members_title(m[1])}", text)
