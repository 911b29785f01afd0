"""Per-tool and per-capability rechecks: cooldown, sharing, in-place restore."""

from __future__ import annotations

import asyncio

import pytest

from capd.recovery import Rechecker, UnknownTool
from capd.registry import UnknownCapability
from tests.helpers.fakes import Clock, FlipProbe, make_registry


def setup(up: dict[str, bool], cooldown_s: float = 30.0) -> tuple[Rechecker, FlipProbe, Clock]:
    registry = make_registry(
        {"a.one": ("db",), "a.two": ("db", "web"), "a.three": ("web",)}, up
    )
    probe = FlipProbe(**up)
    clock = Clock()
    rechecker = Rechecker(lambda: registry, cooldown_s=cooldown_s, probe=probe, clock=clock)
    return rechecker, probe, clock


async def test_recheck_restores_a_capability_when_its_tool_is_back() -> None:
    """A disabled capability whose tool came back is restored in place."""
    rechecker, probe, _ = setup({"db": False, "web": True})
    probe.up["db"] = True
    outcome = await rechecker.recheck_disabled_capability("a.one")
    assert outcome.live
    assert outcome.restored == ("a.one", "a.two")
    assert probe.calls == {"db": 1}


async def test_cooldown_is_honoured_and_force_overrides_it() -> None:
    """Within the cooldown a recheck answers from the last probe; force probes anyway."""
    rechecker, probe, clock = setup({"db": False, "web": True}, cooldown_s=30)
    await rechecker.recheck_tool("db")
    probe.up["db"] = True
    clock.advance(29.9)
    skipped = await rechecker.recheck_tool("db")
    assert (skipped.probed, skipped.result.ok) == (False, False)
    assert skipped.cooldown_left_s == pytest.approx(0.1)
    forced = await rechecker.recheck_tool("db", force=True)
    assert (forced.probed, forced.result.ok) == (True, True)
    assert probe.calls["db"] == 2
    assert rechecker.stats.skipped_cooldown == 1


async def test_after_the_cooldown_a_recheck_probes_again() -> None:
    """Once the cooldown has passed the tool is probed again."""
    rechecker, probe, clock = setup({"db": False, "web": True}, cooldown_s=30)
    await rechecker.recheck_tool("db")
    probe.up["db"] = True
    clock.advance(30.0)
    outcome = await rechecker.recheck_tool("db")
    assert outcome.probed
    assert outcome.restored == ("a.one", "a.two")


async def test_concurrent_callers_share_one_probe() -> None:
    """Ten concurrent rechecks of one tool cause one probe and all see its result."""
    rechecker, probe, _ = setup({"db": False, "web": True})
    probe.up["db"] = True
    probe.release.clear()
    waiters = [asyncio.create_task(rechecker.recheck_tool("db")) for _ in range(10)]
    await asyncio.sleep(0)
    probe.release.set()
    outcomes = await asyncio.gather(*waiters)
    assert probe.calls["db"] == 1
    assert all(o.result.ok for o in outcomes)
    assert rechecker.stats.shared == 9


async def test_partial_recovery_keeps_an_updated_missing_list() -> None:
    """When one of two missing tools comes back, the missing list shrinks to the other."""
    rechecker, probe, _ = setup({"db": False, "web": False})
    probe.up["web"] = True
    outcome = await rechecker.recheck_disabled_capability("a.two")
    assert not outcome.live
    assert outcome.missing == ("db",)
    assert outcome.restored == ("a.three",)
    assert sorted(probe.calls) == ["db", "web"]


async def test_recheck_tool_restores_every_capability_it_unblocks() -> None:
    """One tool recheck restores all capabilities that were waiting only on it."""
    rechecker, probe, _ = setup({"db": False, "web": True})
    probe.up["db"] = True
    outcome = await rechecker.recheck_tool("db")
    assert outcome.restored == ("a.one", "a.two")


async def test_live_capability_recheck_probes_nothing() -> None:
    """Rechecking a live capability is free."""
    rechecker, probe, _ = setup({"db": True, "web": True})
    outcome = await rechecker.recheck_disabled_capability("a.one")
    assert outcome.live
    assert probe.calls == {}


async def test_unknown_names_fail_closed() -> None:
    """Unknown tools and capabilities raise typed errors."""
    rechecker, _, _ = setup({"db": True, "web": True})
    with pytest.raises(UnknownTool):
        await rechecker.recheck_tool("nope")
    with pytest.raises(UnknownCapability):
        await rechecker.recheck_disabled_capability("a.nope")


async def test_background_loop_heals_without_a_caller() -> None:
    """The background loop re-probes disabled tools and restores capabilities on its own."""
    rechecker, probe, _ = setup({"db": False, "web": True}, cooldown_s=0)
    registry_live = rechecker._registry().live_view()
    stop = asyncio.Event()
    task = asyncio.create_task(rechecker.run(0.01, stop))
    probe.up["db"] = True
    async with asyncio.timeout(5):
        while "a.one" not in registry_live:
            await asyncio.sleep(0.01)
    stop.set()
    await task
    assert probe.calls["db"] >= 1
    assert "web" not in probe.calls  # live tools are not re-probed by this loop


async def test_background_loop_notices_a_live_tool_going_down() -> None:
    """With live_every_s, live tools are re-probed too and a failure disables at once."""
    rechecker, probe, clock = setup({"db": True, "web": True}, cooldown_s=0)
    registry = rechecker._registry()
    stop = asyncio.Event()
    probe.up["web"] = False
    task = asyncio.create_task(rechecker.run(0.01, stop, live_every_s=50))
    await asyncio.sleep(0)
    clock.advance(100)
    async with asyncio.timeout(5):
        while registry.disabled_entry("a.three") is None:
            await asyncio.sleep(0.01)
    stop.set()
    await task
    assert registry.disabled_entry("a.two") is not None
