"""Crash bench: many real kill -9s of the daemon at every point of a job's life.

The same harness as tests/recovery/test_crash.py with more kills (default 200). Prints
the kills by point, acknowledged jobs, lost jobs (must be 0), duplicated
side effects for verify_first (must be 0) and for replay (a kill may land amid
several concurrent replays, each then done twice: printed per kill),
and integrity-check failures (must be 0). Baseline: the bound itself — replay
duplicates are printed as a ratio to the number of kills.

    python bench/crash.py [--kills 200]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's `queue` (which aiosqlite
# imports): keep this folder off sys.path, and put the repository on it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from tests.helpers.crashlib import CrashRun, summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--per-capability", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="capd-crash-", dir="/tmp"))
    try:
        report = CrashRun(folder).run(args.kills, args.per_capability)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    line = json.loads(summary(report))
    print(f"crash bench: {line['kills']} kill -9s {line['by_point']} in {line['seconds']} s")
    print(f"  acknowledged jobs {line['acknowledged_jobs']}, lost {line['lost']}")
    print(f"  verify_first duplicates {line['duplicates_verify_first']}")
    print(f"  replay duplicates {line['duplicates_replay']} "
          f"(ratio to kills {line['duplicates_replay'] / max(1, line['kills']):.2f}, bound 1.00)")
    print(f"  integrity-check failures {line['integrity_failures']}")
    if report.lost or report.duplicates_verify_first or report.integrity_failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
