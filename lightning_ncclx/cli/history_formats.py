"""Ready-to-use forms of ``history``'s exclude list: SLURM's ``--exclude=`` and a Kubernetes
node affinity. Host names come from summary.json files (untrusted): only plain host names
(letters, digits, ``.``, ``_``, ``-``) are printed; the others are returned to be reported."""

from __future__ import annotations

import re
from typing import Any

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def plain_hosts(hosts: list[str]) -> tuple[list[str], list[str]]:
    """(hosts fit for a command line, the others)."""
    good = [h for h in hosts if isinstance(h, str) and _HOST.fullmatch(h)]
    return good, [h for h in hosts if h not in good]


def slurm_exclude(hosts: list[str]) -> str:
    """``--exclude=a,b`` for sbatch/srun; empty when there is nothing to exclude."""
    return f"--exclude={','.join(hosts)}" if hosts else ""


def node_affinity(hosts: list[str]) -> dict[str, Any] | None:
    """A pod spec's ``affinity.nodeAffinity`` that keeps the job off ``hosts`` (None: none to avoid)."""
    if not hosts:
        return None
    expression = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": list(hosts)}
    terms = [{"matchExpressions": [expression]}]
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
