"""One authority: who a peer is, decided once per connection and configuration generation.

A peer's credentials are read when its connection is accepted, from the socket
itself: SO_PEERCRED (pid, uid, gid) and SO_PEERGROUPS (the supplementary groups
it had when it connected). Both are what the kernel recorded at ``connect()``:
a process that connects and hands the descriptor to a child, then exits, leaves
the child with the connector's credentials, never "unknown". Where the kernel
has no SO_PEERGROUPS, the groups are read from /proc at accept time; groups that
cannot be read are ``None`` and every rule that needs them fails closed.

:class:`Authority` turns those credentials into a :class:`~._grant.Grant` under
one generation's configuration (``allow_uids``, ``allow_gids``,
``operator_uids``, ``[profiles]``, ``[[peers]]``). The daemon builds a new one
at every reload, so a uid taken out of ``allow_uids`` or ``operator_uids`` loses
what it had on its next request.

Rules, in order:

1. A caller that is not a socket peer (in-process) is an operator.
2. A ``[[peers]]`` entry naming the uid binds it; else the first entry naming its
   primary or a supplementary gid. Bound: an agent with that profile and channel.
   When gid entries exist, no uid entry matched and the groups could not be read,
   the caller is refused: which entry (if any) names it cannot be known.
3. Otherwise the peer must be let in (root, the daemon's uid, ``allow_uids``, or
   a gid in ``allow_gids``); it is an operator when its uid is root, the daemon's
   or in ``operator_uids``, else an agent with every capability.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .._errors import BadRequest
from ._grant import OPERATOR, Caller, Grant, Narrowing, Profile, WideningRefused

_CRED = struct.Struct("3i")
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13
_MAX_CACHED = 4096
MAX_GRANT_HEADER_BYTES = 16384
MAX_GRANT_NAMES = 512
GRANT_HEADER = "capd-grant"
"""The request header a client narrows its grant with: a JSON object with ``allow``
(capability names or aliases), ``tags`` and ``channel``, each optional."""


_NOBODY = Caller(pid=0, uid=-1, gid=-1, groups=frozenset())
"""A peer whose credentials cannot exist (not a Unix socket): every authority refuses it."""


class PeerRefused(Exception):
    """The peer may not use the socket at all (403); the message says why."""


class GrantRefused(Exception):
    """The peer asked for more than its grant (403); the message says why."""


def _groups_from_proc(pid: int) -> frozenset[int] | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


def peer_groups(sock: socket.socket, pid: int) -> frozenset[int] | None:
    """The supplementary groups the peer connected with; None when they cannot be read."""
    size = 64
    while size <= 65536:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * size)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                size *= 32
                continue
            break  # no SO_PEERGROUPS here: /proc, read now, is the next best
        return frozenset(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))
    return _groups_from_proc(pid) if pid > 0 else None


def peer_credentials(sock: Any) -> Caller:
    """The credentials of a connection's peer (empty when it is not a Unix socket)."""
    if sock is None:  # no socket at all: an in-process transport (tests, embedders)
        return Caller()
    if sock.family != socket.AF_UNIX:  # no credentials to read: never an operator
        return _NOBODY
    pid, uid, gid = _CRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return Caller(pid=pid, uid=uid, gid=gid, groups=peer_groups(sock, pid))


@dataclass(frozen=True, slots=True)
class PeerBinding:
    """A ``[[peers]]`` entry: callers (by uid or gid) bound to a profile and a channel."""

    profile: str | None
    uid: int | None = None
    gid: int | None = None
    channel: str | None = None


class Authority:
    """Grants for one configuration generation (see the module docstring for the rules)."""

    def __init__(self, *, own_uid: int | None = None, allow_uids: Iterable[int] = (),
                 allow_gids: Iterable[int] = (), operator_uids: Iterable[int] = (),
                 profiles: Mapping[str, Profile] | None = None,
                 bindings: Sequence[PeerBinding] = ()) -> None:
        own = os.geteuid() if own_uid is None else own_uid
        self.admitted_uids = frozenset({0, own, *allow_uids})
        self.admitted_gids = frozenset(allow_gids)
        self.operator_uids = frozenset({0, own, *operator_uids})
        self.profiles: Mapping[str, Profile] = dict(profiles or {})
        self.bindings = tuple(bindings)
        self._by_uid: dict[int, PeerBinding] = {}
        for binding in self.bindings:
            if binding.uid is not None:
                self._by_uid.setdefault(binding.uid, binding)
        self._by_gid = [b for b in self.bindings if b.uid is None and b.gid is not None]
        # peer credentials -> its grant, or the sentence refusing it
        self._grants: dict[tuple[int, int | None, frozenset[int] | None], Grant | str] = {}
        self._narrowed: dict[tuple[int, str], tuple[Grant, Grant]] = {}

    def grant_for(self, peer: Caller) -> Grant:
        """The grant of ``peer``; raise :class:`PeerRefused` when it may not connect."""
        if peer.uid is None:
            return peer.grant
        key = (peer.uid, peer.gid, peer.groups)
        found = self._grants.get(key)
        if found is None:
            found = self._decide(peer.uid, peer.gid, peer.groups)
            if len(self._grants) >= _MAX_CACHED:
                self._grants.clear()
            self._grants[key] = found
        if isinstance(found, str):
            # A new exception each time: a kept one would gather tracebacks, and with
            # them every refused request's frames, for as long as it is cached.
            raise PeerRefused(found)
        return found

    def _decide(self, uid: int, gid: int | None, groups: frozenset[int] | None) -> Grant | str:
        """The grant of these credentials, or why they are refused."""
        binding = self._by_uid.get(uid)
        if binding is None and self._by_gid:
            if groups is None:  # which binding names it (if any) cannot be known
                return (f"capd could not read the supplementary groups of uid {uid}, and "
                        "[[peers]] binds callers by group: refused rather than let in under "
                        "a guess (bind this uid by uid instead)")
            binding = next((b for b in self._by_gid
                            if b.gid == gid or b.gid in groups), None)
        if binding is not None:
            profile = self.profiles[binding.profile] if binding.profile is not None else None
            return Grant("agent", profile, None, binding.channel, bound=True)
        admitted = (uid in self.admitted_uids or gid in self.admitted_gids
                    or (groups is not None and not self.admitted_gids.isdisjoint(groups)))
        if not admitted:
            return ("this uid may not use the capd socket; ask the operator to add it to "
                    "allow_uids or allow_gids")
        # The operator's grant is the one object a peer starts with: its requests need no
        # Caller of their own (the connection's serves).
        return OPERATOR if uid in self.operator_uids else Grant("agent")

    def narrow(self, grant: Grant, header: str) -> Grant:
        """``grant`` held to what the ``Capd-Grant`` header asks.

        Raises :class:`BadRequest` for a header that is not such an object and
        :class:`GrantRefused` for one that would widen the grant.
        """
        key = (id(grant), header)
        found = self._narrowed.get(key)
        if found is not None and found[0] is grant:
            return found[1]
        try:
            narrowed = grant.narrowed(parse_narrowing(header))
        except WideningRefused as exc:
            raise GrantRefused(str(exc)) from exc
        if len(self._narrowed) >= _MAX_CACHED:
            self._narrowed.clear()
        # one object per grant and header: what the gateway's chain cache keys on
        self._narrowed[key] = (grant, narrowed)
        return narrowed


def _names(body: Mapping[str, Any], key: str) -> frozenset[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadRequest(f"Capd-Grant: {key} must be a list of non-empty strings")
    return frozenset(v.removeprefix("@") for v in value)


def parse_narrowing(header: str) -> Narrowing:
    """The narrowing a ``Capd-Grant`` header asks for; raise :class:`BadRequest`."""
    if len(header) > MAX_GRANT_HEADER_BYTES:
        raise BadRequest(f"Capd-Grant is {len(header)} bytes; at most "
                         f"{MAX_GRANT_HEADER_BYTES} (name at most {MAX_GRANT_NAMES} "
                         "capabilities and tags)")
    try:
        body = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Capd-Grant must be a JSON object: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("Capd-Grant must be a JSON object with allow, tags and channel")
    unknown = set(body) - {"allow", "tags", "channel", "label"}
    if unknown:
        raise BadRequest(f"Capd-Grant: unknown key {', '.join(sorted(unknown))}; "
                         "the keys are allow, tags, channel and label")
    channel = body.get("channel")
    if channel is not None and (not isinstance(channel, str) or not channel):
        raise BadRequest("Capd-Grant: channel must be a non-empty string")
    label = body.get("label", "--allow")
    if not isinstance(label, str):
        raise BadRequest("Capd-Grant: label must be a string")
    allow, tags = _names(body, "allow"), _names(body, "tags")
    if len(allow) + len(tags) > MAX_GRANT_NAMES:
        raise BadRequest(f"Capd-Grant names {len(allow) + len(tags)} capabilities and tags; "
                         f"at most {MAX_GRANT_NAMES} (use a tag, or a profile in capd.toml)")
    if "allow" in body and not allow and not tags:
        raise BadRequest("Capd-Grant: an empty allow list would hide everything; name at "
                         "least one capability")
    return Narrowing(allow, tags, channel, label[:80])


def actor(caller: Caller) -> str:
    """Who did an operator action, for the audit trail: uid, pid and grant."""
    if caller.uid is None:
        return "in-process caller"
    return f"uid {caller.uid} pid {caller.pid} ({caller.grant.describe()})"
