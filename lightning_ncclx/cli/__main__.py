"""``python -m lightning_ncclx.cli``: the same as the ``lightning-ncclx`` command."""

import sys

from lightning_ncclx.cli import main

sys.exit(main())
