"""What one rank of a test job sees of lightning-ncclx's set-up, as a JSON-ready dict (shared by
the strategy test jobs, which import it as a sibling module)."""

from __future__ import annotations

import os
import pickle
from typing import Any


def what_this_rank_sees(trainer: Any) -> dict[str, Any]:
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace

    from lightning_ncclx.backend.serving import serving_implementations
    from lightning_ncclx.backend.timeouts import current_timeouts

    strategy = trainer.strategy
    trace = pickle.loads(_dump_fr_trace(True, False, False))  # this process's own recorder
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "serving": serving_implementations(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TORCH_FR_", "TORCH_NCCL_", "LIGHTNING_NCCLX"))},
        "timeouts": current_timeouts(),
        "ops": [e["profiling_name"] for e in trace.get("entries", [])],
        "strategy_class": type(strategy).__name__,
        "dump_dir": str(getattr(strategy, "ncclx_dump_dir", None)),
        "callbacks": [type(c).__name__ for c in trainer.callbacks],
        "setup_line": strategy.ncclx_setup_line() if hasattr(strategy, "ncclx_setup_line") else None,
    }
