"""The authority (who a peer is, what it may reach) and the token bucket, with an injected
clock; the grants through the real socket are in tests/e2e/test_trust_boundary_e2e.py."""

from __future__ import annotations

import json
import os
import socket

import pytest

from capd.registry import Capability
from capd.sidecar._errors import BadRequest
from capd.sidecar.server._authority import (
    Authority,
    GrantRefused,
    PeerBinding,
    PeerRefused,
    parse_narrowing,
    peer_credentials,
)
from capd.sidecar.server._gateway import Caller
from capd.sidecar.server._grant import Grant, Narrowing, Profile
from capd.sidecar.server._peers import RateLimiter
from tests.helpers.fakes import Clock

READER = Profile("reader", ("notes.read*",), ("safe",))


def _cap(name: str, *, tags: tuple[str, ...] = (), aliases: tuple[str, ...] = (),
         channels: tuple[str, ...] = ()) -> Capability:
    from pydantic import BaseModel

    class Empty(BaseModel):
        pass

    return Capability(name=name, summary="s", parameters=Empty, func=lambda p: None,
                      tags=tags, aliases=aliases, channels=channels)


def test_own_uid_and_root_are_operators_others_refused_unless_listed() -> None:
    """Our uid and root are operators; another uid is refused, unless allowed by uid or
    group, and then it is an agent with every capability, not an operator."""
    authority = Authority(own_uid=1000)
    assert authority.grant_for(Caller(pid=1, uid=1000, gid=1000)).role == "operator"
    assert authority.grant_for(Caller(pid=1, uid=0, gid=0)).role == "operator"
    with pytest.raises(PeerRefused, match="allow_uids"):
        authority.grant_for(Caller(pid=1, uid=1001, gid=1001, groups=frozenset()))
    listed = Authority(own_uid=1000, allow_uids=[1001])
    grant = listed.grant_for(Caller(pid=1, uid=1001, gid=1001, groups=frozenset()))
    assert (grant.role, grant.restricted) == ("agent", False)
    by_group = Authority(own_uid=1000, allow_gids=[50])
    assert by_group.grant_for(Caller(pid=1, uid=1002, gid=7, groups=frozenset({50}))).role \
        == "agent"
    assert Authority(own_uid=1000, operator_uids=[1003], allow_uids=[1003]).grant_for(
        Caller(pid=1, uid=1003, gid=1003, groups=frozenset())).role == "operator"


def test_a_binding_by_uid_wins_and_makes_an_agent_even_of_an_operator_uid() -> None:
    """A [[peers]] uid entry binds that uid (even the daemon's own) to its profile."""
    authority = Authority(own_uid=1000, profiles={"reader": READER},
                          bindings=[PeerBinding("reader", uid=1000)])
    grant = authority.grant_for(Caller(pid=1, uid=1000, gid=1000, groups=frozenset()))
    assert (grant.role, grant.profile, grant.bound) == ("agent", READER, True)
    assert grant.allows(_cap("notes.read"))
    assert grant.allows(_cap("other.x", tags=("safe",)))
    assert not grant.allows(_cap("notes.write"))


def test_a_gid_binding_reads_the_groups_given_and_fails_closed_without_them() -> None:
    """A supplementary-gid binding matches the groups read at accept time; when they could
    not be read, a caller the binding might name is refused, never let in unbound."""
    authority = Authority(own_uid=1000, allow_uids=[2000], profiles={"reader": READER},
                          bindings=[PeerBinding("reader", gid=777)])
    bound = authority.grant_for(Caller(pid=1, uid=2000, gid=2000, groups=frozenset({777})))
    assert bound.profile == READER
    free = authority.grant_for(Caller(pid=1, uid=2000, gid=2000, groups=frozenset({5})))
    assert free.profile is None
    with pytest.raises(PeerRefused, match="supplementary groups"):
        authority.grant_for(Caller(pid=1, uid=2000, gid=2000, groups=None))
    # even a primary gid that a binding names: an earlier, narrower binding could name
    # one of the groups that cannot be read
    with pytest.raises(PeerRefused, match="supplementary groups"):
        authority.grant_for(Caller(pid=1, uid=2000, gid=777, groups=None))


def test_a_refusal_is_a_new_exception_each_time() -> None:
    """A cached refusal is a sentence, raised anew: an exception kept in the cache would
    gather every refused request's traceback (and its body) until the next reload."""
    authority = Authority(own_uid=1000)
    peer = Caller(pid=1, uid=1001, gid=1001, groups=frozenset())
    caught = []
    for _ in range(2):
        with pytest.raises(PeerRefused) as refused:
            authority.grant_for(peer)
        caught.append(refused.value)
    assert caught[0] is not caught[1]
    assert str(caught[0]) == str(caught[1])


def test_an_oversized_narrowing_is_refused() -> None:
    """Capd-Grant is bounded in bytes and in names (each distinct one is cached)."""
    names = [f"n{i}.x" for i in range(600)]
    with pytest.raises(BadRequest, match="at most 512"):
        parse_narrowing(json.dumps({"allow": names}))
    with pytest.raises(BadRequest, match="bytes"):
        parse_narrowing(json.dumps({"allow": ["a" * 20000]}))


def test_a_new_authority_is_a_new_decision() -> None:
    """Grants are decided per authority (one per configuration generation): a uid taken
    out of allow_uids is refused by the next one."""
    peer = Caller(pid=1, uid=2000, gid=2000, groups=frozenset())
    assert Authority(own_uid=1000, allow_uids=[2000]).grant_for(peer).role == "agent"
    with pytest.raises(PeerRefused):
        Authority(own_uid=1000).grant_for(peer)


def test_a_narrowing_only_takes_away() -> None:
    """Capd-Grant narrows by names, aliases and tags, makes an agent of an operator, and
    cannot move a caller bound to a channel to another one."""
    authority = Authority(own_uid=1000, allow_uids=[3000], profiles={"reader": READER},
                          bindings=[PeerBinding("reader", uid=3000, channel="team")])
    operator = authority.grant_for(Caller(pid=1, uid=1000, gid=1000))
    narrowed = authority.narrow(operator, '{"allow": ["notes.read", "@short"]}')
    assert narrowed.role == "agent"
    assert narrowed.allows(_cap("notes.read"))
    assert narrowed.allows(_cap("x.y", aliases=("short",)))
    assert not narrowed.allows(_cap("notes.write"))
    bound = authority.grant_for(Caller(pid=1, uid=3000, gid=3000, groups=frozenset()))
    both = authority.narrow(bound, '{"allow": ["notes.write", "notes.read_all"]}')
    assert not both.allows(_cap("notes.write"))  # outside the profile: still outside
    assert both.allows(_cap("notes.read_all"))
    with pytest.raises(GrantRefused, match="channel 'team'"):
        authority.narrow(bound, '{"channel": "private"}')
    assert authority.narrow(bound, '{"channel": "team"}').channel == "team"
    assert authority.narrow(operator, '{"channel": "private"}').channel == "private"
    no_channel = Authority(own_uid=1000, profiles={"reader": READER},
                           bindings=[PeerBinding("reader", uid=3001)])
    plain = no_channel.grant_for(Caller(pid=1, uid=3001, gid=3001, groups=frozenset()))
    with pytest.raises(GrantRefused, match="no channel"):  # its binding fixes "none"
        no_channel.narrow(plain, '{"channel": "private"}')


@pytest.mark.parametrize("header", ["nope", "[]", '{"allow": "a"}', '{"allow": []}',
                                    '{"wider": true}', '{"channel": ""}', '{"allow": [1]}'])
def test_a_malformed_narrowing_is_a_bad_request(header: str) -> None:
    """A Capd-Grant header that is not the documented object is refused with why."""
    with pytest.raises(BadRequest, match="Capd-Grant"):
        parse_narrowing(header)


def test_channels_run_only_for_their_callers() -> None:
    """A capability with channels runs only for a grant speaking from one of them."""
    private = _cap("mail.read", channels=("private",))
    assert Grant(channel="private").speaks_for(private)
    assert not Grant(channel="public").speaks_for(private)
    assert not Grant().speaks_for(private)
    assert Grant().speaks_for(_cap("mail.count"))
    assert Narrowing(channel="x").limits is False


def test_peer_credentials_carry_the_groups_the_peer_connected_with() -> None:
    """SO_PEERGROUPS (or /proc at accept time) gives the connector's supplementary groups."""
    server, client = socket.socketpair(socket.AF_UNIX)
    with server, client:
        peer = peer_credentials(server)
    assert (peer.pid, peer.uid) == (os.getpid(), os.geteuid())
    assert peer.groups is not None
    assert set(os.getgroups()) <= peer.groups | {os.getegid()}


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


def test_an_agent_grant_spends_its_own_bucket() -> None:
    """An agent narrowed under the operator's uid cannot spend the operator's calls."""
    clock = Clock()
    limiter = RateLimiter(rate_per_s=1, burst=2, clock=clock)
    agent = Caller(uid=0, grant=Grant().narrowed(Narrowing(frozenset({"a.b"}))))
    assert [limiter.take(agent) for _ in range(3)][-1] is not None
    assert limiter.take(Caller(uid=0)) is None


def test_a_batch_of_calls_spends_a_token_a_call() -> None:
    """POST /calls takes one token for each call it makes, all or none."""
    clock = Clock()
    limiter = RateLimiter(rate_per_s=1, burst=8, clock=clock)
    alice = Caller(uid=1)
    assert limiter.take(alice, 6) is None
    wait = limiter.take(alice, 3)  # 2 left: refused whole, nothing taken
    assert wait is not None
    assert abs(wait - 1.0) < 1e-9
    assert limiter.take(alice, 2) is None
    assert limiter.take(alice) is not None
