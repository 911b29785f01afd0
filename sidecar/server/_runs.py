"""Engine runs: which processes belong to which agent's run, held to the agent's grant.

An agent's engine runs as the daemon's user unless ``run_as`` names another, and the
socket treats the daemon's user as an operator. So every run is tracked, and every
process of it (the engine and all its descendants, whatever they do) is:

- **held to the agent's grant**: a connection from one of them is the agent, never
  the operator (what the agent's capabilities reach, nothing else: the same 404 as any
  outside caller);
- **killed when the run ends** (answered, failed, timed out or cancelled), a descendant
  that called ``setsid``/``setpgid`` or double-forked included.

Membership is decided the strongest way the host allows:

1. a **cgroup per run** (cgroup v2 under the daemon's own cgroup, or the v1 ``pids``
   hierarchy): the engine moves itself into the run's cgroup before it execs, every
   descendant is born there, and only root may move a process out. A peer belongs to
   a run when ``/proc/PID/cgroup`` names it; the run ends by killing every process in
   it until it is empty.
2. without a writable cgroup hierarchy, a **marker** in the environment
   (``CAPD_RUN=<secret>``) and the process tree: a peer belongs to a run when its
   environment carries a live run's secret or an ancestor is the run's engine. A
   descendant that both clears its environment and leaves the tree escapes this; the
   cgroup does not let it. (The daemon is not made a child subreaper: orphans it did
   not spawn would stay zombies with it, since its event loop reaps only its own.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from ._grant import Grant

log = structlog.get_logger("capd.runs")

MARKER = "CAPD_RUN"
"""The environment variable carrying a run's secret."""
KILL_ROUNDS = 50
"""How many times the processes of a run are looked for and killed before giving up
(each round waits a little for the kernel to take the killed ones out)."""


@dataclass
class Run:
    """One engine run: its secret, the agent's grant, its cgroup (if any), its engine."""

    token: str
    agent: str
    grant: Grant
    cgroup: Path | None = None
    engine_pid: int | None = None


def _find_cgroup_base() -> Path | None:
    """A folder where this process may make a cgroup per run (None: there is none):
    under its own cgroup v2, else under its v1 ``pids`` cgroup. Folders left by daemons
    that are gone (a crash) are removed on the way."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    places: list[Path] = []
    for line in own:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            places.append(Path("/sys/fs/cgroup") / relative)
        elif controllers == "" and Path("/sys/fs/cgroup/unified/cgroup.controllers").exists():
            places.append(Path("/sys/fs/cgroup/unified") / relative)
        elif "pids" in controllers.split(","):
            places.append(Path("/sys/fs/cgroup/pids") / relative)
    for base in places:
        _remove_stale(base)
        folder = base / f"capd-runs-{os.getpid()}"
        try:
            folder.mkdir(exist_ok=True)
            probe = folder / "probe"
            probe.mkdir()
            probe.rmdir()
        except OSError:
            continue
        return folder
    return None


class EngineRuns:
    """The engine runs in flight and the processes that belong to each."""

    def __init__(self, *, use_cgroups: bool = True) -> None:
        self._runs: dict[str, Run] = {}
        self._use_cgroups = use_cgroups
        self._cgroups: Path | None = None
        self._looked = False  # for a cgroup folder: made with the first run, not before

    @property
    def cgroups(self) -> Path | None:
        """The folder of this daemon's run cgroups (made at the first run; None: none)."""
        if not self._looked:
            self._looked = True
            self._cgroups = _find_cgroup_base() if self._use_cgroups else None
        return self._cgroups

    @property
    def active(self) -> bool:
        """Whether any run is in flight (a connection's membership is read only then)."""
        return bool(self._runs)

    def start(self, agent: str, grant: Grant) -> Run:
        """A new run of ``agent`` held to ``grant``; its cgroup made when there are cgroups."""
        token = secrets.token_hex(16)
        run = Run(token, agent, grant)
        if self.cgroups is not None:
            folder = self.cgroups / f"run-{token[:16]}"
            try:
                folder.mkdir()
                run.cgroup = folder
            except OSError as exc:
                log.warning("engine_cgroup_unavailable", agent=agent, error=str(exc))
        self._runs[token] = run
        return run

    def environment(self, run: Run) -> dict[str, str]:
        """What the engine's environment carries for its run."""
        return {MARKER: run.token}

    def launcher(self, run: Run, argv: tuple[str, ...], uid: int | None,
                 gid: int | None) -> list[str]:
        """``argv`` wrapped so that the process moves itself into the run's cgroup (as the
        daemon's user) and then drops to ``uid``/``gid`` before it execs the engine."""
        if run.cgroup is None and uid is None:
            return list(argv)
        procs = str(run.cgroup / "cgroup.procs") if run.cgroup is not None else ""
        return [sys.executable, "-S", "-c", _TRAMPOLINE, procs,
                "" if uid is None else str(uid), "" if gid is None else str(gid), *argv]

    def attach(self, run: Run, pid: int) -> None:
        """The engine of ``run`` started as ``pid``."""
        run.engine_pid = pid

    def grant_of(self, pid: int | None) -> Grant | None:
        """The grant of the run ``pid`` belongs to; None when it belongs to none."""
        if pid is None or pid <= 0 or not self._runs:
            return None
        run = self._run_of(pid)
        return run.grant if run is not None else None

    async def finish(self, run: Run) -> int:
        """End ``run``: kill every process of it (a descendant that left the engine's
        process group and session included) and forget it; how many were killed. Ending
        a run that has ended already does nothing."""
        if run.token not in self._runs:
            return 0
        killed = 0
        try:
            for _ in range(KILL_ROUNDS):
                # a walk of /proc without a cgroup: off the loop
                pids = await asyncio.to_thread(lambda: set(self._members(run)))
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
                await asyncio.sleep(0.02)
            else:
                log.warning("engine_run_survivors", agent=run.agent,
                            pids=sorted(self._members(run)))
        finally:
            self._runs.pop(run.token, None)
            if run.cgroup is not None:
                with contextlib.suppress(OSError):
                    run.cgroup.rmdir()
        if killed:
            log.info("engine_run_killed", agent=run.agent, processes=killed)
        return killed

    def close(self) -> None:
        """Remove the daemon's folder of run cgroups (each run removed its own)."""
        if self._cgroups is not None:
            with contextlib.suppress(OSError):
                self._cgroups.rmdir()

    # -- membership ------------------------------------------------------------------

    def _members(self, run: Run) -> Iterator[int]:
        """The live processes of ``run``."""
        me = os.getpid()
        if run.cgroup is not None:
            with contextlib.suppress(OSError):
                for line in (run.cgroup / "cgroup.procs").read_text().split():
                    if int(line) != me:
                        yield int(line)
            return
        for pid in _all_pids():
            if pid != me and self._run_of(pid) is run:
                yield pid

    def _run_of(self, pid: int) -> Run | None:
        if self._cgroups is not None:
            run = self._run_by_cgroup(pid)
            if run is not None or all(r.cgroup is not None for r in list(self._runs.values())):
                return run
        return self._run_by_marker(pid)

    def _run_by_cgroup(self, pid: int) -> Run | None:
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        for run in list(self._runs.values()):
            if run.cgroup is not None and f"/run-{run.token[:16]}" in text:
                return run
        return None

    def _run_by_marker(self, pid: int) -> Run | None:
        """The run whose secret ``pid``'s environment carries, or whose engine is an
        ancestor of ``pid`` (up to 64 generations)."""
        runs = dict(self._runs)  # a copy: this may run in a thread while runs start
        engines = {r.engine_pid: r for r in runs.values() if r.engine_pid}
        current = pid
        for _ in range(64):
            if current in engines:
                return engines[current]
            token = _marker_of(current)
            if token is not None and token in runs:
                return runs[token]
            parent = _parent_of(current)
            if parent is None or parent <= 1 or parent == os.getpid():
                return None
            current = parent
        return None


_TRAMPOLINE = """
import os, sys
procs, uid, gid, *argv = sys.argv[1:]
if procs:
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
if gid:
    os.setgroups([])
    os.setgid(int(gid))
if uid:
    os.setuid(int(uid))
os.execvp(argv[0], argv)
"""
"""Run as the engine's first process: into the run's cgroup (as the daemon's user, who
may), then down to the engine's user, then the engine itself (same pid)."""


def _all_pids() -> Iterator[int]:
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                yield int(entry.name)


def _marker_of(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = MARKER.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("ascii", "replace")
    return None


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields after the last ")"
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 else None


def _remove_stale(base: Path) -> None:
    """Remove the empty run-cgroup folders of capd daemons no longer running."""
    with contextlib.suppress(OSError):
        for folder in base.glob("capd-runs-*"):
            pid = folder.name.removeprefix("capd-runs-")
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                for run in folder.glob("run-*"):
                    with contextlib.suppress(OSError):
                        run.rmdir()
                with contextlib.suppress(OSError):
                    folder.rmdir()
