"""The serving generation's search index: built off the loop, narrowed per grant.

At start-up the index is built in a thread once the daemon serves (a search waits for
it, a call does not); a reload builds its registry's index before the swap. A grant
that sees only part of the catalogue searches an index of that part alone, kept per
reach, least recently used first out.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from capd.registry import Registry

from .._errors import SearchUnavailable
from ._grant import Grant

if TYPE_CHECKING:
    from capd.registry import SearchIndex

log = structlog.get_logger("capd.search")

MAX_REACHES = 64
"""Indexes of a grant's reach kept at once."""


class SearchIndexes:
    """The search index of ``registry()`` (the serving one) and of each grant's reach."""

    def __init__(self, registry: Callable[[], Registry], cache_dir: Callable[[], Path],
                 spawn: Callable[[Awaitable[SearchIndex]], asyncio.Task[SearchIndex]],
                 outcomes: Callable[[], Mapping[str, Counter[str]]]) -> None:
        self._registry = registry
        self._cache_dir = cache_dir
        self._spawn = spawn
        self._outcomes = outcomes
        self._building: tuple[Registry, asyncio.Task[SearchIndex]] | None = None
        self._boosts: tuple[float, Mapping[str, float]] | None = None
        # (index, what a grant reaches) -> the index of that reach, least recently used first
        self._reaches: dict[tuple[int, tuple[int, ...]], tuple[SearchIndex, SearchIndex]] = {}

    def build_soon(self, registry: Registry) -> asyncio.Task[SearchIndex]:
        """Build ``registry``'s index (capsule vectors cached on disk) in a thread."""
        async def build() -> SearchIndex:
            started = time.monotonic()
            index = await asyncio.to_thread(registry.prepare_search, self._cache_dir())
            log.info("search_ready", capabilities=len(registry),
                     duration_s=round(time.monotonic() - started, 3))
            return index

        task = self._spawn(build())
        self._building = (registry, task)
        return task

    def boosts(self, max_age_s: float = 1.0) -> Mapping[str, float]:
        """Each called capability's search boost from its success rate, made again at most
        every ``max_age_s`` (thousands of called capabilities take milliseconds)."""
        now = time.monotonic()
        if self._boosts is None or now - self._boosts[0] > max_age_s:
            from capd.registry import success_boost  # with the search stack, when searched

            self._boosts = (now, success_boost(self._outcomes()))
        return self._boosts[1]

    async def index(self, grant: Grant | None = None) -> SearchIndex:
        """The serving registry's search index, or for a restricted ``grant`` the index of
        what it may see (kept per reach, made off the loop); waits while it is built.

        A build that failed is tried again by the next search, which answers the
        failure meanwhile (:class:`SearchUnavailable`).
        """
        index = await self._full_index()
        if grant is None or not grant.restricted:
            return index
        # by what the grant reaches (not by how the caller spelled it: a new label or
        # order makes no new index), computed off the loop
        reach = await asyncio.to_thread(index.reach, grant.allows)
        key = (id(index), reach)
        found = self._reaches.get(key)
        if found is None or found[0] is not index:
            subset = await asyncio.to_thread(index.subset, reach)
            while len(self._reaches) >= MAX_REACHES:  # the least recently used goes first
                self._reaches.pop(next(iter(self._reaches)))
            found = self._reaches[key] = (index, subset)
        else:
            self._reaches.pop(key)
            self._reaches[key] = found  # now the most recently used
        return found[1]

    async def _full_index(self) -> SearchIndex:
        registry = self._registry()
        if registry.search_prepared:
            return registry.search_index()
        pending = self._building
        if pending is None or pending[0] is not registry or (
                pending[1].done() and (pending[1].cancelled()
                                       or pending[1].exception() is not None)):
            task = self.build_soon(registry)
        else:
            task = pending[1]
        try:
            return await asyncio.shield(task)
        except Exception as exc:  # the build's own error, whatever it is: say it, retry later
            raise SearchUnavailable(
                f"the search index could not be built ({type(exc).__name__}: {exc}); the "
                "next search tries again, and `capd reload` rebuilds it") from exc
