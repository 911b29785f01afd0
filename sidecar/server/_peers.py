"""Who may use the socket: peer credentials against an allowlist, and a per-peer rate limit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ._services import Caller


def supplementary_groups(pid: int) -> frozenset[int]:
    """The peer process's supplementary groups from /proc (empty when unreadable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


class PeerPolicy:
    """The daemon's own uid and root by default, plus configured uids and groups.

    Root is always let in: it can read the socket whatever its mode, and could
    act as the daemon's user anyway; refusing it only gets in an operator's way.
    """

    def __init__(self, uids: Iterable[int] = (), gids: Iterable[int] = (),
                 *, own_uid: int | None = None) -> None:
        self.uids = frozenset({0, os.geteuid() if own_uid is None else own_uid, *uids})
        self.gids = frozenset(gids)

    def allows(self, caller: Caller) -> bool:
        """Whether ``caller`` may talk to the daemon at all."""
        if caller.uid is None:  # not a Unix-socket peer (tests with an in-process client)
            return True
        if caller.uid in self.uids:
            return True
        if not self.gids:
            return False
        if caller.gid in self.gids:
            return True
        return caller.pid is not None and bool(self.gids & supplementary_groups(caller.pid))


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per peer uid: ``rate_per_s`` sustained, ``burst`` at once."""

    def __init__(self, rate_per_s: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._buckets: dict[int | None, _Bucket] = {}

    def take(self, caller: Caller) -> float | None:
        """Take one token; None when allowed, else the seconds until a token is free."""
        if self.rate_per_s <= 0:
            return None
        now = self._clock()
        bucket = self._buckets.get(caller.uid)
        if bucket is None:
            bucket = self._buckets[caller.uid] = _Bucket(float(self.burst), now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate_per_s)
        bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        return (1 - bucket.tokens) / self.rate_per_s
