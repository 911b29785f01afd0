"""Full reload: rebuild off to the side, then swap what serves in one assignment.

While a reload runs, the old generation keeps serving ``/health`` and calls; a
call in flight keeps the generation it started with. A reload that fails leaves
the old one in place and reports why. Reloads requested while one runs
coalesce into a single follow-up run, so every requester sees a build that
started after it asked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Generic, Protocol, TypeVar

import structlog
from pydantic import BaseModel, ConfigDict

from capd.registry import CapdError

log = structlog.get_logger("capd.reload")


class ReloadOutcome(BaseModel):
    """What a reload did."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    generation: int
    started_at: float
    duration_s: float
    error: str | None = None
    live: int | None = None
    disabled: int | None = None
    errors: int | None = None


class Counted(Protocol):
    """What a reload builds, as far as its report goes: a registry, or a generation."""

    def counts(self) -> Mapping[str, int]: ...


Built = TypeVar("Built", bound=Counted)


class Reloader(Generic[Built]):
    """Runs full reloads, one at a time, coalescing concurrent requests.

    ``rebuild`` builds what will serve (raising :class:`CapdError` with a clear
    message on failure); ``swap`` installs it.
    """

    def __init__(
        self,
        rebuild: Callable[[], Awaitable[Built]],
        swap: Callable[[Built], None],
        *,
        spawn: Callable[[Awaitable[ReloadOutcome]], asyncio.Task[ReloadOutcome]],
        on_start: Callable[[], object] = lambda: None,
        on_end: Callable[[ReloadOutcome], object] = lambda _o: None,
    ) -> None:
        self._rebuild = rebuild
        self._swap = swap
        self._spawn = spawn
        self._on_start = on_start
        self._on_end = on_end
        self._current: asyncio.Task[ReloadOutcome] | None = None
        self._follow_up: asyncio.Task[ReloadOutcome] | None = None
        self.count = 0
        self.ok_count = 0
        self.last: ReloadOutcome | None = None
        self.last_failure: ReloadOutcome | None = None  # cleared by the next good reload

    @property
    def running(self) -> bool:
        """Whether a reload is under way."""
        return self._current is not None and not self._current.done()

    async def reload(self) -> ReloadOutcome:
        """Reload, or join the follow-up of the reload under way; return its outcome.

        Cancelling the caller does not cancel the reload.
        """
        if self.running:
            if self._follow_up is None or self._follow_up.done():
                current = self._current
                assert current is not None
                self._follow_up = self._spawn(self._after(current))
            return await asyncio.shield(self._follow_up)
        self._current = self._spawn(self._run())
        return await asyncio.shield(self._current)

    async def _after(self, current: asyncio.Task[ReloadOutcome]) -> ReloadOutcome:
        await asyncio.wait([current])
        self._current = asyncio.current_task()
        return await self._run()

    async def _run(self) -> ReloadOutcome:
        self.count += 1
        generation = self.count
        started_at = time.time()
        started = time.perf_counter()
        self._on_start()
        log.info("reload_started", generation=generation)
        try:
            built = await self._rebuild()
        except Exception as exc:  # a failed reload is reported; the old one keeps serving
            error = str(exc) if isinstance(exc, CapdError) else f"{type(exc).__name__}: {exc}"
            outcome = ReloadOutcome(ok=False, generation=generation, started_at=started_at,
                                    duration_s=time.perf_counter() - started, error=error)
            log.error("reload_failed", generation=generation, error=error)
        else:
            self._swap(built)
            self.ok_count += 1
            counts = dict(built.counts())
            outcome = ReloadOutcome(ok=True, generation=generation, started_at=started_at,
                                    duration_s=time.perf_counter() - started,
                                    live=counts["live"], disabled=counts["disabled"],
                                    errors=counts["errors"])
            log.info("reload_finished", generation=generation,
                     duration_s=round(outcome.duration_s, 4), **counts)
        self.last = outcome
        self.last_failure = None if outcome.ok else outcome
        self._on_end(outcome)
        return outcome
