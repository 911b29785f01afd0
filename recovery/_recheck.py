"""Per-tool and per-capability re-probes with a cooldown: the cheap recovery path.

A recheck probes only the tools that are missing, never rebuilds and never
imports. Each tool has a cooldown (default 30 s) measured on an injected
monotonic clock: within it, a recheck answers from the last result. Concurrent
callers for the same tool share one probe. One :class:`asyncio.Lock` owned by
the :class:`Rechecker` guards the cooldown table and the in-flight probes; the
probes themselves run outside it so different tools are probed in parallel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial

import structlog

from capd.registry import Probe, ProbeResult, Registry, UnknownCapability, run_probe

from ._errors import UnknownTool

log = structlog.get_logger("capd.recheck")

DEFAULT_COOLDOWN_S = 30.0


@dataclass(frozen=True)
class ToolRecheck:
    """The outcome of rechecking one tool."""

    tool: str
    result: ProbeResult
    probed: bool
    restored: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    cooldown_left_s: float = 0.0


@dataclass(frozen=True)
class CapabilityRecheck:
    """The outcome of rechecking one capability."""

    name: str
    live: bool
    missing: tuple[str, ...]
    tools: tuple[ToolRecheck, ...] = ()
    restored: tuple[str, ...] = ()


@dataclass
class RecheckStats:
    """Counters since start."""

    probes: int = 0
    skipped_cooldown: int = 0
    shared: int = 0
    restored: int = 0


class Rechecker:
    """Re-probes tools of the current registry and restores capabilities in place.

    ``registry`` is a getter, so that a full reload that swaps the registry is
    seen at once. Plain Python probes run on ``executor``. ``clock`` is
    monotonic seconds (inject one in tests).
    """

    def __init__(self, registry: Callable[[], Registry], *,
                 cooldown_s: float = DEFAULT_COOLDOWN_S, probe: Probe | None = None,
                 executor: Executor | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self.cooldown_s = cooldown_s
        self._probe: Probe = probe or partial(run_probe, executor=executor)
        self._clock = clock
        self._lock = asyncio.Lock()
        self._last_probe_at: dict[str, float] = {}
        self._in_flight: dict[str, asyncio.Future[ProbeResult]] = {}
        self.stats = RecheckStats()

    async def recheck_tool(self, tool: str, *, force: bool = False) -> ToolRecheck:
        """Probe ``tool`` (unless within its cooldown) and restore what it unblocks.

        Raises :class:`UnknownTool` if no such tool is declared. With ``force``
        the cooldown is ignored. Cancelling one caller does not cancel a probe
        that other callers share.
        """
        registry = self._registry()
        try:
            spec = registry.tool_spec(tool)
        except KeyError as exc:
            raise UnknownTool(tool) from exc
        async with self._lock:
            shared = self._in_flight.get(tool)
            if shared is None:
                last = self._last_probe_at.get(tool)
                now = self._clock()
                cached = registry.probe_result(tool)
                if not force and last is not None and cached is not None:
                    left = self.cooldown_s - (now - last)
                    if left > 0:
                        self.stats.skipped_cooldown += 1
                        return ToolRecheck(tool, cached, probed=False, cooldown_left_s=left)
                self._last_probe_at[tool] = now
                shared = asyncio.ensure_future(self._probe(tool, spec))
                self._in_flight[tool] = shared
                shared.add_done_callback(lambda _f: self._in_flight.pop(tool, None))
                self.stats.probes += 1
            else:
                self.stats.shared += 1
        result = await asyncio.shield(shared)
        # The registry may have been swapped by a reload while we probed: apply
        # the result to the current one, which is the one callers will use.
        current = self._registry()
        if not current.has_tool(tool):
            return ToolRecheck(tool, result, probed=True)
        restored, disabled = current.record_probe(result)
        if restored:
            self.stats.restored += len(restored)
            log.info("capability_restored", tool=tool, capabilities=restored)
        if disabled:
            log.warning("capability_disabled", tool=tool, capabilities=disabled, error=result.error)
        return ToolRecheck(tool, result, probed=True, restored=tuple(restored),
                           disabled=tuple(disabled))

    async def recheck_disabled_capability(self, name: str, *, force: bool = False
                                          ) -> CapabilityRecheck:
        """Re-probe only the missing tools of ``name``, concurrently; restore it if all pass.

        A live capability is returned as is. Raises :class:`UnknownCapability`.
        """
        registry = self._registry()
        name = registry.resolve(name)  # an alias answers as its capability; raises if unknown
        entry = registry.disabled_entry(name)
        if entry is None:
            return CapabilityRecheck(name, live=True, missing=())
        outcomes = await asyncio.gather(
            *(self.recheck_tool(tool, force=force) for tool in entry.missing))
        current = self._registry()
        try:
            after = current.disabled_entry(name)
        except UnknownCapability:
            return CapabilityRecheck(name, live=False, missing=entry.missing, tools=tuple(outcomes))
        restored = tuple(sorted({n for o in outcomes for n in o.restored}))
        return CapabilityRecheck(name, live=after is None, missing=after.missing if after else (),
                                 tools=tuple(outcomes), restored=restored)

    async def run(self, interval_s: float, stop: asyncio.Event, *,
                  live_every_s: float | None = None) -> None:
        """Re-probe disabled tools every ``interval_s`` until ``stop`` is set.

        With ``live_every_s``, every tool (live ones too) is re-probed that
        often, so a tool that goes down is noticed without a failing call.
        """
        last_full = self._clock()
        while not stop.is_set():
            try:
                async with asyncio.timeout(interval_s):
                    await stop.wait()
                return
            except TimeoutError:
                pass
            registry = self._registry()
            if live_every_s is not None and self._clock() - last_full >= live_every_s:
                last_full = self._clock()
                tools = registry.tool_ids()  # live ones too
            else:
                tools = registry.disabled_tools()
            outcomes = await asyncio.gather(*(self.recheck_tool(t) for t in sorted(tools)))
            if outcomes:
                log.debug("background_recheck", tools=[o.tool for o in outcomes if o.probed])
