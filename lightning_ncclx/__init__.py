"""lightning-ncclx: PyTorch Lightning strategies on torch's NCCL backends with the flight
recorder configured and a stall watchdog that names the rank and collective behind a hang.

``import lightning_ncclx`` registers ``ddp_ncclx``, ``ddp_ncclx_spawn``, ``fsdp_ncclx`` and
``fsdp2_ncclx`` with ``lightning.pytorch`` and ``pytorch_lightning`` (where installed), and
``ddp_ncclx`` with ``lightning.fabric``, as soon as Lightning is imported (this import itself
stays cheap: no torch)::

    import lightning_ncclx
    trainer = Trainer(strategy="ddp_ncclx", accelerator="cpu", devices=2)
"""

from __future__ import annotations

__version__ = "0.1.0"

from lightning_ncclx.registration import install as _install_registration

_install_registration()
