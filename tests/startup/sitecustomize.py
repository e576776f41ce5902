"""Run at the start of every Python process of the test suite (``make test`` puts this folder on
``PYTHONPATH``). The jobs' ranks and helpers spend most of their CPU importing torch and Lightning
and tearing those imports down at exit. Nothing the tests check depends on when, or whether,
the cyclic collector runs:

- a higher first threshold collects less often while the imports run (about a seventh of their CPU);
- once every ``atexit`` handler has run (this one is registered first, so it runs last: after the
  plugin's own handlers and after non-daemon threads were joined), the heap is frozen, so the
  interpreter's final collections skip it (``python -c "import torch, lightning.pytorch"``: 4.03
  CPU-s without this, 3.47 with it, 5 interleaved runs each). Cycles
  still alive then are not collected; extension modules built with nanobind (triton's) report
  their objects in such cycles as leaks on stderr, so those report lines, and only those, are
  filtered out of the process's stderr from that point on.
"""

import atexit
import gc
import os
import subprocess
import sys

gc.set_threshold(20_000, 50, 100)

_NANOBIND_REPORT = (r"/^nanobind: /d; /^ - leaked /d; /^ - \.\.\. skipped remainder/d; "
                    r"/^See https:\/\/nanobind\.readthedocs\.io/d")


def _freeze_before_teardown() -> None:
    if "torch" not in sys.modules:  # a small process: nothing worth skipping
        return
    if "triton._C.libtriton" in sys.modules:
        try:
            sys.stderr.flush()
            original = os.dup(2)
            sed = subprocess.Popen(["sed", "-u", _NANOBIND_REPORT], stdin=subprocess.PIPE, stdout=original,
                                   stderr=original, close_fds=True)
            os.close(original)
            os.dup2(sed.stdin.fileno(), 2)
        except OSError:
            return  # no sed: collect as usual rather than print the report
    gc.freeze()


atexit.register(_freeze_before_teardown)
