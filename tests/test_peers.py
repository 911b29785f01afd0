"""The peer allowlist and the token bucket, with an injected clock."""

from __future__ import annotations

import os

from capd.sidecar.server._gateway import Caller
from capd.sidecar.server._peers import PeerPolicy, RateLimiter

from .fakes import Clock


def test_own_uid_and_root_are_allowed_others_not() -> None:
    """Our uid and root pass; another uid does not, unless listed by uid or group."""
    policy = PeerPolicy(own_uid=1000)
    assert policy.allows(Caller(pid=1, uid=1000, gid=1000))
    assert policy.allows(Caller(pid=1, uid=0, gid=0))
    assert not policy.allows(Caller(pid=1, uid=1001, gid=1001))
    assert PeerPolicy([1001], own_uid=1000).allows(Caller(pid=1, uid=1001, gid=1001))
    assert PeerPolicy(gids=[50], own_uid=1000).allows(Caller(pid=1, uid=1002, gid=50))


def test_supplementary_groups_are_read_from_proc() -> None:
    """A peer in an allowed supplementary group passes (this process's own groups)."""
    groups = os.getgroups()
    if not groups:
        return
    policy = PeerPolicy(gids=[groups[-1]], own_uid=123456)
    assert policy.allows(Caller(pid=os.getpid(), uid=123457, gid=999999))


def test_token_bucket_burst_then_rate() -> None:
    """A burst passes at once; then one call per 1/rate seconds, per uid."""
    clock = Clock()
    limiter = RateLimiter(rate_per_s=2, burst=3, clock=clock)
    alice, bob = Caller(uid=1), Caller(uid=2)
    assert [limiter.take(alice) for _ in range(3)] == [None, None, None]
    wait = limiter.take(alice)
    assert wait is not None
    assert abs(wait - 0.5) < 1e-9
    assert limiter.take(bob) is None
    clock.advance(0.5)
    assert limiter.take(alice) is None
    assert RateLimiter(0, 1).take(alice) is None
