"""Where a run's dumps go: one folder per run, the same on every rank, known before the
process group exists (torch reads its dump-on-timeout prefix from the environment)."""

from __future__ import annotations

import os
from pathlib import Path

from lightning_ncclx.layout import run_id_from_environment

DUMPS_FOLDER_NAME = "ncclx_dumps"
TORCH_DUMPS_SUBFOLDER = "torch"


def hydra_output_dir() -> Path | None:
    """The running Hydra job's output folder, or None outside Hydra (never imports Hydra)."""
    import sys

    if "hydra" not in sys.modules:
        return None
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001 - Hydra present but not running a job: not an error
        return None
    return None


def resolve_dump_dir(
    configured: str | os.PathLike[str] | None,
    default_root_dir: str | os.PathLike[str] | None,
    run_id: str | None = None,
    trainer_number: int = 1,
) -> Path:
    """The run's dump folder: the configured one, else Hydra's output folder, else
    ``<default_root_dir>/ncclx_dumps/<run id>`` (``<default_root_dir>/ncclx_dumps`` with no run id).
    ``run_id`` defaults to the launcher's (:func:`run_id_from_environment`). Under Hydra the n-th
    Trainer (n >= 2) of the job gets ``ncclx_dumps-<n>``, so two Trainers never share a folder.

    ``$VARIABLES`` and ``~`` in a configured folder are expanded in each rank's own environment,
    so one setting such as ``'$TMPDIR/ncclx/$SLURM_JOB_ID'`` gives every node its local folder."""
    if configured is not None and str(configured).strip():
        return Path(os.path.expandvars(os.path.expanduser(str(configured)))).absolute()
    hydra_dir = hydra_output_dir()
    if hydra_dir is not None:
        name = DUMPS_FOLDER_NAME if trainer_number <= 1 else f"{DUMPS_FOLDER_NAME}-{trainer_number}"
        return (hydra_dir / name).absolute()
    root = Path(default_root_dir) if default_root_dir is not None else Path.cwd()
    run_id = run_id or run_id_from_environment()
    folder = root / DUMPS_FOLDER_NAME
    return (folder / run_id if run_id else folder).absolute()


def torch_dump_prefix(dump_dir: Path, file_prefix: str) -> Path:
    """The ``TORCH_FR_DUMP_TEMP_FILE`` prefix: torch appends the rank to it."""
    return dump_dir / TORCH_DUMPS_SUBFOLDER / file_prefix


def plugin_named_folders(dump_dir: Path, configured: bool) -> list[Path]:
    """The folders of ``dump_dir``'s path that lightning-ncclx names (deepest first): ``torch/``
    always; the run folder and ``ncclx_dumps`` too unless the dump folder was configured. Any rank
    may remove them once empty: they hold nothing but this plugin's dumps."""
    folders = [dump_dir / TORCH_DUMPS_SUBFOLDER]
    if not configured:
        folders.append(dump_dir)
        if dump_dir.parent.name == DUMPS_FOLDER_NAME:
            folders.append(dump_dir.parent)
    return folders
