"""What every bench shares: rounds and their spread, the results file, servers on a pinned core.

- :class:`Results` appends one JSON line per figure to the file given with
  ``--results`` (bench/run_all.sh gathers them into bench/RESULTS.md); without
  one it only keeps them in memory.
- :func:`spread` is the median and min-max of a figure's rounds.
- :func:`spawn` starts a server process pinned to the bench core, :func:`stop`
  ends it (SIGTERM, then SIGKILL after a grace period), :func:`wait_http`
  waits until a Unix socket answers an HTTP request, and :func:`tree_cpu_s`
  is the CPU a process and its children have used (to show that a server was
  saturated, and that the load generator was not).

Placement. On a machine with two or more cores the server under test runs on
the last core and the load generator on the first, each process on a core of its
own: sharing one core would take the generator's time out of the server's, and
tax most the server that answers fastest (the one that asks the generator for
the most requests). Every server gets the same core; the other core is the
generator's. Cross-core wake-ups cost latency on a virtual machine whose idle
vCPUs halt, and they cost every server alike; what other work still takes of the
server's core while a figure is measured is reported as foreign CPU. The server
and the generator run at nice -10 where allowed, so that other work yields.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPUS = os.cpu_count() or 1
SERVER_CPUS = {CPUS - 1} if CPUS >= 2 else None
GENERATOR_CPUS = {0} if CPUS >= 2 else None
_TICKS = os.sysconf("SC_CLK_TCK")


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of ``values``."""
    return statistics.median(values), min(values), max(values)


@dataclass
class Row:
    """One figure: the median of its rounds, their min and max, and what it is compared with."""

    area: str
    figure: str
    median: float
    lo: float
    hi: float
    unit: str
    rounds: int
    against: str = ""
    ratio: float | None = None
    note: str = ""


@dataclass
class Results:
    """Rows of one bench, appended to ``path`` (JSON lines) as they are made."""

    path: Path | None
    rows: list[Row] = field(default_factory=list)

    def add(self, area: str, figure: str, values: Sequence[float], unit: str, *,
            against: str = "", against_values: Sequence[float] | None = None,
            note: str = "") -> Row:
        """Record a figure from its rounds; ``against_values`` gives the ratio of medians."""
        median, lo, hi = spread(values)
        ratio = None
        if against_values:
            base = statistics.median(against_values)
            ratio = median / base if base else None
        row = Row(area, figure, median, lo, hi, unit, len(values), against, ratio, note)
        self.rows.append(row)
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(json.dumps(asdict(row)) + "\n")
        return row


PRIORITY = -10  # nice value of what is measured, where allowed (root): see pin()


def pin(cpus: set[int] | None) -> None:
    """Pin the calling process (and the threads it starts later) to ``cpus``, at a raised
    priority where allowed, so other work on a shared machine yields the bench core."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)


def spawn(argv: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
          log: Path | None = None, cpus: set[int] | None = SERVER_CPUS) -> subprocess.Popen[bytes]:
    """Start a server pinned to ``cpus``, its output to ``log`` (or discarded)."""
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=(lambda: pin(cpus)) if cpus else None)
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]


def stop(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM the server's process group; SIGKILL it if it has not exited after ``grace_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def http_status(sock: str, path: str = "/health", timeout_s: float = 2.0) -> int | None:
    """Status of ``GET path`` over the Unix socket, None when nothing answers (yet)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(sock)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
                      .encode())
            head = s.recv(64)
    except OSError:
        return None
    if not head.startswith(b"HTTP/1."):
        return None
    return int(head[9:12])


def wait_http(sock: str, proc: subprocess.Popen[bytes], path: str = "/health",
              timeout_s: float = 60.0, log: Path | None = None) -> None:
    """Return once ``sock`` answers ``GET path`` with 200; exit if the server died or timed out."""
    deadline = time.monotonic() + timeout_s
    while http_status(sock, path) != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise SystemExit(f"server on {sock} did not answer {path} with 200: {tail}")
        time.sleep(0.02)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid``, its threads and its descendants."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / _TICKS
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return total


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICKS


def children_cpu_s() -> float:
    """CPU seconds used by this process's waited-for children (the load generator runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    return {"cpu": model, "cores": str(CPUS), "memory": f"{mem_kb / 1024 / 1024:.0f} GiB",
            "kernel": os.uname().release, "load": " ".join(
                f"{x:.2f}" for x in os.getloadavg())}
