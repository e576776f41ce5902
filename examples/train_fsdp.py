"""The FSDP recipe: a small GPT on synthetic tokens with lightning-ncclx's fsdp_ncclx strategy.

    python examples/train_fsdp.py                                  # defaults (conf/train_fsdp.yaml)
    python examples/train_fsdp.py trainer=cpu ncclx.flight_recorder.buffer_size=20000
    python examples/train_fsdp.py experiment=fsdp_cpu_smoke
    python examples/train_fsdp.py trainer=ddp_sim +fault=skip_collective fault.rank=2
    python examples/train_fsdp.py strategy=fsdp2_ncclx trainer=gpu model.activation_checkpointing=true
"""

import hydra
from omegaconf import DictConfig

import recipe


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_fsdp")
def main(cfg: DictConfig) -> None:
    recipe.run_guarded(cfg)


if __name__ == "__main__":
    main()
