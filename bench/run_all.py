"""Run every benchmark with the settings whose results the README shows (about 35 minutes on 2 cores; ~10 GiB of generated dumps under $TMPDIR).

    python bench/run_all.py            # or: make bench
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = [
    ["bench_overhead.py", "--devices", "2,4", "--collective-ranks", "1,2,4", "--repeats", "3", "--steps", "300"],
    ["bench_time_to_summary.py", "--ranks", "2,4,8", "--repeats", "2"],
    ["bench_analyzer.py", "--sizes", "64,256,1024", "--repeat", "3"],
    ["bench_analyzer.py", "--sizes", "1024,4096,16384,1024x20000", "--repeat", "2", "--theirs-max-entries", "0",
     "--plot", str(HERE.parent / "docs" / "analyzer-scaling.png")],
]


def main() -> int:
    failed = 0
    for argv in RUNS:
        print(f"\n$ python bench/{' '.join(argv)}", flush=True)
        failed |= subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]]).returncode
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
