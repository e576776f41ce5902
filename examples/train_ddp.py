"""The DDP recipe: a small GPT on synthetic tokens with lightning-ncclx's ddp_ncclx strategy.

    python examples/train_ddp.py                                  # defaults (conf/train_ddp.yaml)
    python examples/train_ddp.py trainer=cpu ncclx.flight_recorder.buffer_size=20000
    python examples/train_ddp.py experiment=ddp_cpu_smoke
    python examples/train_ddp.py trainer=ddp_sim +fault=skip_collective fault.rank=2
"""

import hydra
from omegaconf import DictConfig

import recipe


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_ddp")
def main(cfg: DictConfig) -> None:
    recipe.run_guarded(cfg)


if __name__ == "__main__":
    main()
