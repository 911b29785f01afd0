"""A per-peer call rate limit (who may use the socket at all is ``_authority.py``'s)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ._grant import Caller


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per peer uid (and agent grant): ``rate_per_s`` sustained, ``burst``
    at once."""

    def __init__(self, rate_per_s: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        # by uid, and apart for each agent grant of a uid (an agent bridge under the
        # operator's uid spends its own bucket, not the operator's)
        self._buckets: dict[tuple[int | None, str | None], _Bucket] = {}

    def take(self, caller: Caller, count: int = 1) -> float | None:
        """Take ``count`` tokens (one a call); None when allowed, else the seconds until
        they are free (none is taken then)."""
        if self.rate_per_s <= 0:
            return None
        now = self._clock()
        key = (caller.uid, caller.grant.tag)
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= 4096:  # bounded: grants come and go
                self._buckets.clear()
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate_per_s)
        bucket.updated = now
        if bucket.tokens >= count:
            bucket.tokens -= count
            return None
        return (min(count, self.burst) - bucket.tokens) / self.rate_per_s
