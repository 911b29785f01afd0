"""Engine runs without the daemon: membership by marker and process tree, the kill at the
end, stale cgroup folders; real processes, no fakes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from capd.sidecar.server._grant import Grant, Profile
from capd.sidecar.server._runs import EngineRuns, _remove_stale

GRANT = Grant("agent", Profile("engine.x", ("e2e.echo",)), bound=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_without_cgroups_a_run_is_found_by_its_marker_and_killed_whole() -> None:
    """A process carrying the run's marker (a grandchild in a session of its own) belongs
    to the run; one without it does not; finish kills the run's processes, no other."""
    runs = EngineRuns(use_cgroups=False)
    run = runs.start("x", GRANT)
    marked = subprocess.Popen(["setsid", "sleep", "60"], env={**os.environ,
                                                              **runs.environment(run)})
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        for _ in range(200):  # until setsid has exec'd sleep with the marker (10 s at most)
            if runs.grant_of(marked.pid) is GRANT:
                break
            await asyncio.sleep(0.05)
        assert runs.grant_of(marked.pid) is GRANT
        assert runs.grant_of(stranger.pid) is None
        assert runs.active
        assert await runs.finish(run) >= 1
        marked.wait(10)
        assert not _alive(marked.pid)
        assert _alive(stranger.pid)
        assert not runs.active
        assert runs.grant_of(stranger.pid) is None
    finally:
        for proc in (marked, stranger):
            proc.kill()
            proc.wait(10)


async def test_a_descendant_of_the_engine_belongs_to_its_run() -> None:
    """Without a marker (cleared environment), a child of the run's engine belongs to it."""
    runs = EngineRuns(use_cgroups=False)
    run = runs.start("x", GRANT)
    engine = subprocess.Popen([sys.executable, "-c",
                               "import subprocess; subprocess.run(['env', '-i', 'sleep', '60'])"])
    try:
        runs.attach(run, engine.pid)
        children: list[str] = []
        for _ in range(200):  # the engine's interpreter starts its child (bounded: 10 s)
            children = Path(f"/proc/{engine.pid}/task/{engine.pid}/children").read_text().split()
            if children:
                break
            await asyncio.sleep(0.05)
        assert children
        assert runs.grant_of(int(children[0])) is GRANT
    finally:
        await runs.finish(run)
        engine.wait(10)


def test_stale_run_folders_of_gone_daemons_are_removed(tmp_path: Path) -> None:
    """capd-runs-<pid> of a daemon that is gone goes (with its empty runs); this one's stays."""
    gone = tmp_path / "capd-runs-999999999"
    (gone / "run-abc").mkdir(parents=True)
    mine = tmp_path / f"capd-runs-{os.getpid()}"
    mine.mkdir()
    _remove_stale(tmp_path)
    assert not gone.exists()
    assert mine.exists()
