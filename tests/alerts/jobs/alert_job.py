"""The watchdog tests' job (``tests/watchdog/jobs/train_job.py``, same arguments) with alerts:
its ``StallWatchdog`` gets ``AlertsConfig(**json.loads($NCCLX_TEST_ALERTS))``. With
``$NCCLX_TEST_PAUSE=rank,batch,seconds`` that rank waits that long after that batch (before
the heartbeat of its end), while the others wait for it in the next step: a wait that ends.
With ``$NCCLX_TEST_KILL_SENDER=<path>`` the first process about to deliver a trigger creates
that file (its rank inside) and SIGKILLs itself: the sender dies at the moment it would send.
With ``$NCCLX_TEST_KILL_BEFORE_CLAIM=<path>`` the first process about to send a trigger does so
before it claims anything (the summary written, the job-wide claim armed)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "watchdog" / "jobs"))

import lightning_ncclx.watchdog as watchdog_package  # noqa: E402
from lightning_ncclx.config import AlertsConfig  # noqa: E402

import train_job  # noqa: E402


class AlertingWatchdog(watchdog_package.StallWatchdog):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        kwargs["alerts"] = AlertsConfig(**json.loads(os.environ["NCCLX_TEST_ALERTS"]))
        super().__init__(*args, **kwargs)
        pause = os.environ.get("NCCLX_TEST_PAUSE")
        self.pause = tuple(float(x) for x in pause.split(",")) if pause else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if self.pause and trainer.global_rank == int(self.pause[0]) and batch_idx == int(self.pause[1]):
            print(f"[rank {trainer.global_rank}] pausing {self.pause[2]:g} s after batch {batch_idx}", flush=True)
            time.sleep(self.pause[2])
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def _kill_the_first_sender(marker: str) -> None:
    import lightning_ncclx.alerts.notifier as notifier

    deliver = notifier.deliver

    def deliver_or_die(path, document, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if document.get("action") == "trigger":
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                pass
            else:
                os.write(fd, os.environ.get("LOCAL_RANK", "0").encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return deliver(path, document, *args, **kwargs)

    notifier.deliver = deliver_or_die


def _write_marker_and_die(marker: str) -> None:
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.write(fd, os.environ.get("LOCAL_RANK", "0").encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_the_first_trigger_before_its_claim(marker: str) -> None:
    from lightning_ncclx.alerts.notifier import AlertNotifier

    trigger = AlertNotifier.trigger

    def die_then_trigger(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        _write_marker_and_die(marker)
        return trigger(self, *args, **kwargs)

    AlertNotifier.trigger = die_then_trigger


if os.environ.get("NCCLX_TEST_KILL_BEFORE_CLAIM"):
    _kill_the_first_trigger_before_its_claim(os.environ["NCCLX_TEST_KILL_BEFORE_CLAIM"])
if os.environ.get("NCCLX_TEST_KILL_SENDER"):
    _kill_the_first_sender(os.environ["NCCLX_TEST_KILL_SENDER"])
watchdog_package.StallWatchdog = AlertingWatchdog  # train_job imports it when it builds the callbacks

if __name__ == "__main__":
    sys.exit(train_job.main())
