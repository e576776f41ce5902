"""The ``lightning-ncclx`` command's exit statuses, for every subcommand.

0: nothing found (no hang, no recurring host, a sound set-up); 1: a finding (a hang diagnosed, a
host to exclude, a broken set-up); 2: bad input (unreadable path, wrong arguments, an internal
error reported in one line).
"""

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_BAD_INPUT = 2
