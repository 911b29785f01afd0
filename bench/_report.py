"""Write bench/RESULTS.md from one run of bench/run_all.sh: one table, the machine, the date.

    python bench/_report.py --results RESULTS.jsonl --logs DIR --seconds N --load-before "a b c"
                            [--out bench/RESULTS.md]

The table holds every row the benches recorded (median over interleaved rounds,
min-max, and the ratio of medians to what the row is compared with). Each
bench's printed output follows, in the order run, and a line for every bench
that failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import json
import platform
import sqlite3
import subprocess
import time
from importlib import metadata

from bench._harness import machine
from bench._loadgen import KIND

PACKAGES = ("aiohttp", "uvicorn", "granian", "uvloop", "httptools", "huey", "persist-queue",
            "litequeue", "aiosqlite", "mcp", "fastmcp")


def number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def versions() -> str:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False, cwd=_HERE.parent)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                           check=False, cwd=_HERE.parent)
    return done.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


NARRATIVE = "## What the figures say"
"""The heading of the hand-written part of RESULTS.md, kept at every run."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--logs", type=Path, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--load-before", default="")
    parser.add_argument("--out", type=Path, default=_HERE / "RESULTS.md")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    box = machine()
    lines = [
        "# capd bench results",
        "",
        "Written by `bench/run_all.sh`; every figure comes from that one run. Do not edit by "
        "hand: run it again.",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; commit {commit()}; the whole run took "
        f"{args.seconds / 60:.1f} min",
        f"- machine: {box['cpu']}, {box['cores']} cores, {box['memory']}, Linux "
        f"{box['kernel']}; load average before {args.load_before or '?'}, after "
        f"{box['load']} (other work on the machine shows up as spread)",
        f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}; {versions()}",
        f"- load generator: {KIND}, the same for every server; the server under test and the "
        "generator pinned together to the last core (cross-core wake-ups cost a halted vCPU's "
        "wake-up on this VM, see bench/_harness.py); the generator's and other processes' "
        "(foreign) CPU are in the notes",
        "- Median over interleaved rounds (each subject once per round); min-max is the spread "
        "over rounds; ratio = this row's median / the median of the row it is set against.",
        "",
        "| area | figure | median | min-max | unit | rounds | against | ratio | note |",
        "| --- | --- | ---: | ---: | --- | ---: | --- | ---: | --- |",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else ""
        spread = f"{number(r['lo'])}-{number(r['hi'])}" if r["rounds"] > 1 else ""
        lines.append(f"| {r['area']} | {r['figure']} | {number(r['median'])} | {spread} | "
                     f"{r['unit']} | {r['rounds']} | {r['against']} | {ratio} | {r['note']} |")
    failed = (args.logs / "failed.txt").read_text().splitlines() \
        if (args.logs / "failed.txt").exists() else []
    lines += ["", "## Did not run or failed", ""]
    lines += [f"- {line}" for line in failed] or ["- nothing"]
    lines += ["", "## What each bench printed", ""]
    for log in sorted(args.logs.glob("*.out")):
        lines += [f"### {log.stem[3:]}", "", "```", log.read_text(errors="replace").rstrip(),
                  "```", ""]
    # the narrative written by hand below the figures is kept
    before = args.out.read_text() if args.out.exists() else ""
    kept = before[before.index(NARRATIVE):] if NARRATIVE in before else ""
    args.out.write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))
    print(f"wrote {args.out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
