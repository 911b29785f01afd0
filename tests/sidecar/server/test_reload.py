"""The Reloader: off-to-the-side rebuilds, atomic swap, coalescing, failure keeps the old."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from capd.registry import PluginError, Registry
from capd.sidecar.server._reload import Reloader, ReloadOutcome
from tests.helpers.fakes import make_registry


class Box:
    def __init__(self) -> None:
        self.registry: Registry = make_registry({"a.old": ()}, {})
        self.builds = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.building = asyncio.Event()  # set when a rebuild has begun
        self.fail = False

    async def rebuild(self) -> Registry:
        self.builds += 1
        self.building.set()
        await self.gate.wait()
        if self.fail:
            raise PluginError("demo", "SyntaxError: invalid syntax (demo.py:1)")
        return make_registry({f"a.v{self.builds}": ()}, {})

    def swap(self, registry: Registry) -> None:
        self.registry = registry


def reloader_for(box: Box) -> Reloader:
    def spawn(coro: Awaitable[ReloadOutcome]) -> asyncio.Task[ReloadOutcome]:
        return asyncio.ensure_future(coro)

    return Reloader(box.rebuild, box.swap, spawn=spawn)


async def test_reload_swaps_in_the_new_registry() -> None:
    """A successful reload installs the new registry and reports its counts."""
    box = Box()
    outcome = await reloader_for(box).reload()
    assert outcome.ok
    assert (outcome.generation, outcome.live) == (1, 1)
    assert "a.v1" in box.registry


async def test_old_registry_serves_until_the_swap() -> None:
    """During the rebuild the old registry stays in place."""
    box = Box()
    box.gate.clear()
    reloader = reloader_for(box)
    task = asyncio.create_task(reloader.reload())
    await asyncio.wait_for(box.building.wait(), 5)
    assert reloader.running
    assert "a.old" in box.registry
    box.gate.set()
    await task
    assert "a.old" not in box.registry


async def test_a_failed_reload_keeps_the_old_registry_and_says_why() -> None:
    """A broken plugin leaves the old registry and reports the error."""
    box = Box()
    box.fail = True
    reloader = reloader_for(box)
    outcome = await reloader.reload()
    assert not outcome.ok
    assert outcome.error == (
        "plugin 'demo' failed to import: SyntaxError: invalid syntax (demo.py:1)"
    )
    assert "a.old" in box.registry
    assert reloader.last == outcome
    assert reloader.last_failure == outcome  # shown by /health until a good reload
    box.fail = False
    assert (await reloader.reload()).ok
    assert reloader.last_failure is None


async def test_concurrent_reloads_coalesce_into_one_follow_up() -> None:
    """Requests during a reload share one follow-up run: two builds, not five."""
    box = Box()
    box.gate.clear()
    reloader = reloader_for(box)
    first = asyncio.create_task(reloader.reload())
    await asyncio.wait_for(box.building.wait(), 5)
    others = [asyncio.create_task(reloader.reload()) for _ in range(4)]
    await asyncio.sleep(0)  # one loop turn: each task has entered reload() and joined
    assert reloader.running
    assert not any(t.done() for t in others)
    box.gate.set()
    results = await asyncio.gather(first, *others)
    assert box.builds == 2
    assert results[0].generation == 1
    assert {r.generation for r in results[1:]} == {2}
    assert "a.v2" in box.registry
