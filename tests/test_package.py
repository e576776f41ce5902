"""The package import is cheap and registers the names with every Lightning flavour."""

from __future__ import annotations

import subprocess

from support import PYTHON, clean_env

PROBE = """
import sys, time
start = time.perf_counter()
import lightning_ncclx
print("heavy", [m for m in ("torch", "lightning", "pytorch_lightning") if m in sys.modules])
{then}
"""


def run(code: str) -> str:
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_does_not_pull_in_torch_or_lightning() -> None:
    assert "heavy []" in run(PROBE.format(then=""))


def test_names_registered_whichever_is_imported_first() -> None:
    check = (
        "from lightning.pytorch.strategies import StrategyRegistry as A\n"
        "from lightning.fabric.strategies import STRATEGY_REGISTRY as B\n"
        "from pytorch_lightning.strategies import StrategyRegistry as C\n"
        "print('names', all(n in R for R in (A, C) for n in ('ddp_ncclx', 'ddp_ncclx_spawn')), 'ddp_ncclx' in B)\n"
    )
    assert "names True True" in run(PROBE.format(then=check))
    assert "names True True" in run("import lightning.pytorch, pytorch_lightning\n" + PROBE.format(then=check))


def test_registered_name_builds_our_strategy() -> None:
    code = (
        "from lightning.pytorch import Trainer\n"
        "t = Trainer(strategy='ddp_ncclx_spawn', accelerator='cpu', devices=2, logger=False)\n"
        "print('class', type(t.strategy).__name__, t.strategy._start_method)\n"
    )
    assert "class DDPNcclxStrategy spawn" in run(PROBE.format(then=code))


def test_doctor_reports_and_flags_a_malformed_variable() -> None:
    ok = subprocess.run([PYTHON, "-m", "lightning_ncclx.cli", "doctor", "--json"], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert '"nccl_resolution"' in ok.stdout
    bad = subprocess.run([PYTHON, "-m", "lightning_ncclx.cli", "doctor"], capture_output=True, text=True,
                         env=clean_env({"TORCH_FR_BUFFER_SIZE": "2000x"}), timeout=120)
    assert bad.returncode == 1
    assert "TORCH_FR_BUFFER_SIZE" in bad.stdout and "not an integer" in bad.stdout
