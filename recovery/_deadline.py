"""Call timeouts on one shared ticker instead of one event-loop timer per call.

``asyncio.timeout`` arms a timer per use; under uvloop that is a libuv timer
made and torn down each time, about 3 µs, paid by every call. Capability
timeouts are seconds long, so capd checks every in-flight deadline on one
ticker that runs every ``RESOLUTION_S`` while any call is in flight: a call
times out at most that much late, and a call costs a set insertion.

The semantics are ``asyncio.timeout``'s: the overdue task is cancelled, and the
cancellation leaves the ``async with`` block as :class:`TimeoutError`; a
cancellation from elsewhere stays a cancellation.
"""

from __future__ import annotations

import asyncio
import weakref
from types import TracebackType

RESOLUTION_S = 0.02


class _Expiry:
    __slots__ = ("expired", "task", "when")

    def __init__(self, task: asyncio.Task[object], when: float) -> None:
        self.task = task
        self.when = when
        self.expired = False


class _Ticker:
    """The deadlines of one event loop, checked every ``RESOLUTION_S`` while any is set."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the ticker is the value of a weak mapping keyed by its loop, and a
        # strong reference here would keep every loop (and its ticker) alive for good.
        self.loop_ref = weakref.ref(loop)
        self.live: set[_Expiry] = set()
        self._armed = False

    def add(self, entry: _Expiry, loop: asyncio.AbstractEventLoop) -> None:
        self.live.add(entry)
        if not self._armed:
            self._armed = True
            loop.call_later(RESOLUTION_S, self._tick)

    def _tick(self) -> None:
        loop = self.loop_ref()
        if loop is None:  # the loop is gone, and its tasks with it
            return
        now = loop.time()
        for entry in [e for e in self.live if e.when <= now and not e.expired]:
            entry.expired = True
            entry.task.cancel()
        if self.live:
            loop.call_later(RESOLUTION_S, self._tick)
        else:
            self._armed = False


_TICKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ticker] = (
    weakref.WeakKeyDictionary())


_last: _Ticker | None = None  # the ticker used last: one loop serves a daemon's calls


def _last_ticker(loop: asyncio.AbstractEventLoop) -> _Ticker:
    """``loop``'s ticker (the weak mapping is looked up only when the loop changes)."""
    global _last
    ticker = _last
    if ticker is None or ticker.loop_ref() is not loop:
        ticker = _TICKERS.get(loop)
        if ticker is None:
            ticker = _TICKERS[loop] = _Ticker(loop)
        _last = ticker
    return ticker


class deadline:
    """``async with deadline(seconds):`` raises TimeoutError when the block overruns."""

    __slots__ = ("_cancelling", "_delay", "_entry", "_ticker")

    def __init__(self, delay_s: float) -> None:
        self._delay = delay_s

    @property
    def expired(self) -> bool:
        """Whether this deadline fired (a TimeoutError from inside the block did not)."""
        return self._entry.expired

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("deadline() must be used inside a task")
        ticker = _last_ticker(loop)
        self._ticker = ticker
        self._cancelling = task.cancelling()
        self._entry = _Expiry(task, loop.time() + self._delay)
        ticker.add(self._entry, loop)

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        entry = self._entry
        self._ticker.live.discard(entry)
        if entry.expired and entry.task.uncancel() <= self._cancelling and (
                exc_type is asyncio.CancelledError):
            raise TimeoutError from exc
