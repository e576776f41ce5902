"""The GPT recipe through LightningCLI instead of Hydra: the ncclx strategies are ordinary
LightningCLI strategies, by name or as ``class_path``/``init_args`` with the typed ``ncclx`` block.

    python examples/train_cli.py fit --trainer.strategy=ddp_ncclx --trainer.accelerator=cpu --trainer.devices=2
    python examples/train_cli.py fit --config examples/cli_ddp_ncclx.yaml
    python examples/train_cli.py fit --config examples/cli_ddp_ncclx.yaml \\
        --trainer.strategy.init_args.ncclx.watchdog.train_step_seconds=120
    python examples/train_cli.py fit --config examples/cli_ddp_ncclx.yaml --print_config   # every ncclx key

A misspelt key is refused before anything starts, naming it
(``unrecognized arguments: --watchdog.train_step_secnds=120``).
"""

from __future__ import annotations

import lightning_ncclx  # noqa: F401  - registers ddp_ncclx, fsdp_ncclx, fsdp2_ncclx by name
from lightning.pytorch.cli import LightningCLI

from gpt_model import GPTLightningModule
from token_data import SyntheticTokens


def main() -> None:
    LightningCLI(GPTLightningModule, SyntheticTokens, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
