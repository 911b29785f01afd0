"""What a caller may reach: its role, the profile binding it, what it narrowed itself to.

A :class:`Grant` is decided once per peer and configuration generation
(``_authority.py``) and travels with every request of that peer as part of its
:class:`~._services.Caller`. Everything that shows, suggests or runs a capability
asks the grant (:meth:`Grant.allows`), so a call, a fallback, an alternative, a
pre-flight, a search, a listing and an export all see the same boundary.

- ``role``: ``operator`` may use every operator row; ``agent`` only the rows that
  admit agents (the table in ``_table.py`` says which).
- ``profile``: the ``[profiles.NAME]`` a ``[[peers]]`` entry binds the caller to
  (None: every capability).
- ``narrowing``: what the caller asked to be held to (``capd mcp --allow``): it can
  only take away, never add; a narrowed caller is an agent.
- ``channel``: where the conversation happens (``private``, ``public``...); a
  capability that declares ``channels`` runs only for a caller speaking from one.

This module imports nothing of the sidecar but the registry's model.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from capd.registry import Capability, Registry, UnknownCapability

Role = Literal["operator", "agent"]
ROLES: tuple[Role, ...] = ("operator", "agent")


class Named(Protocol):
    """What a grant decides by: a capability, or an upstream's resource or prompt (its
    name under the server's prefix, no aliases, the server's tags)."""

    @property
    def name(self) -> str: ...
    @property
    def aliases(self) -> tuple[str, ...]: ...
    @property
    def tags(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class Profile:
    """A named set of capabilities (name globs and tags) a bound caller may use."""

    name: str
    capabilities: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def allows(self, cap: Named) -> bool:
        """Whether ``cap`` is inside this profile: a glob matches its canonical name, an
        exact entry its name or one of its aliases, or a tag is one of its tags.

        A glob never matches through an alias: a pack's ``shell.exec`` aliased
        ``notes.exec`` stays outside ``notes.*`` (an alias is the pack's to choose,
        the profile is the operator's); naming the alias exactly admits it.
        """
        for entry in self.capabilities:
            pattern = entry.removeprefix("@")
            if _is_glob(pattern):
                if fnmatch.fnmatchcase(cap.name, pattern):
                    return True
            elif pattern == cap.name or pattern in cap.aliases:
                return True
        return not set(self.tags).isdisjoint(cap.tags)


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


@dataclass(frozen=True, slots=True)
class Narrowing:
    """What a client asked to be held to: exact capability names (or aliases), tags,
    a channel. No names and no tags means every capability the grant has."""

    capabilities: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()
    channel: str | None = None
    label: str = "--allow"  # how refusals name it (the bridge's flag or profile)

    @property
    def limits(self) -> bool:
        """Whether it limits the capabilities at all (not only the channel)."""
        return bool(self.capabilities or self.tags)

    def allows(self, cap: Named) -> bool:
        """Whether ``cap`` (by its canonical name, an alias or a tag) is inside it."""
        if not self.limits:
            return True
        return (cap.name in self.capabilities
                or not self.capabilities.isdisjoint(cap.aliases)
                or not self.tags.isdisjoint(cap.tags))


class WideningRefused(ValueError):
    """A caller asked for more than its grant (another channel than the one bound)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One caller's boundary. The default is the in-process caller: an operator
    with every capability."""

    role: Role = "operator"
    profile: Profile | None = None
    narrowing: Narrowing | None = None
    channel: str | None = None
    bound: bool = False  # a [[peers]] entry named this caller
    token: str | None = None  # the name of the bearer token that admitted this caller
    # Whether some capability is outside this grant (decided once: every call asks).
    restricted: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "restricted", self.profile is not None or (
            self.narrowing is not None and self.narrowing.limits))

    def allows(self, cap: Named) -> bool:
        """Whether ``cap`` is inside this grant (seen, suggested, called)."""
        if self.profile is not None and not self.profile.allows(cap):
            return False
        return self.narrowing is None or self.narrowing.allows(cap)

    def reaches(self, registry: Registry, name: str) -> bool:
        """Whether a capability named ``name`` in ``registry`` exists inside this grant
        (what may be named to the caller in an answer)."""
        return name in registry and self.allows(registry.get(name))

    def speaks_for(self, cap: Capability) -> bool:
        """Whether this grant's channel is one ``cap`` runs for (any, if it names none)."""
        return not cap.channels or self.channel in cap.channels

    def narrowed(self, narrowing: Narrowing) -> Grant:
        """This grant held to ``narrowing`` as well: an agent's, never wider.

        Raises :class:`WideningRefused` when a caller ``[[peers]]`` binds names another
        channel than its binding's (a binding without one fixes "no channel"): only a
        caller no binding names says for itself where it speaks from.
        """
        channel = self.channel
        if narrowing.channel is not None and narrowing.channel != channel:
            if self.bound:  # its binding says where it speaks from, channel or none
                where = (f"channel {channel!r}" if channel is not None
                         else "no channel (its [[peers]] entry names none)")
                raise WideningRefused(f"this caller is bound to {where}; it cannot speak "
                                      f"from {narrowing.channel!r}")
            channel = narrowing.channel
        if self.narrowing is not None:  # one narrowing per request: it never stacks
            raise WideningRefused("this grant is narrowed already")
        return replace(self, role="agent", narrowing=narrowing, channel=channel)

    @property
    def tag(self) -> str | None:
        """What keeps this grant's names apart from its uid's other callers' (sessions,
        idempotency keys, loop counts): None for the operator (unlimited, no binding
        names it), else ``agent`` and the profile's name. Every agent has one, an
        unbound non-operator uid too, so none shares the operator's name space."""
        if self.token is not None:
            return f"token.{self.token}"
        if self.role == "operator" and not self.restricted and not self.bound:
            return None
        return "agent" if self.profile is None else f"agent.{self.profile.name}"

    def describe(self) -> str:
        """The grant in a few words, for refusals and the audit trail."""
        parts: list[str] = [self.role]
        if self.token is not None:
            parts.append(f"token {self.token}")
        if self.profile is not None:
            parts.append(f"profile {self.profile.name}")
        if self.narrowing is not None and self.narrowing.limits:
            parts.append(f"narrowed by {self.narrowing.label}")
        if self.channel is not None:
            parts.append(f"channel {self.channel}")
        return ", ".join(parts)


OPERATOR = Grant()
"""The grant of a caller that is not a socket peer (in-process) and of an operator."""


def resolve(registry: Registry, name: str, grant: Grant) -> Capability:
    """The capability ``name`` (or an alias, or ``@alias``) inside ``grant``.

    Raises :class:`UnknownCapability` for a name nothing answers to and, the same
    way, for one outside the grant: the caller learns nothing of what is hidden,
    not even its canonical name; suggestions are only what it may see.
    """
    if not grant.restricted:  # the common case: the registry's answer as it is
        return registry.get(name)
    try:
        cap = registry.get(name)
    except UnknownCapability:
        cap = None
    if cap is None or not grant.allows(cap):
        # Unknown and hidden alike: suggestions drawn from what the grant reaches only,
        # the same work either way (no empty list, no timing, telling them apart).
        raise UnknownCapability(name, registry.suggest(name, grant.allows)) from None
    assert cap is not None
    return cap


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the peer's credentials, read from the socket, its session, its grant.

    ``groups`` are the supplementary groups the peer connected with (None: they could
    not be read, and rules that need them fail closed). ``session`` is the
    ``Capd-Session`` header: an agent session (``capd mcp`` sends one per client
    connection), the unit of session grants; loop detection counts by
    :attr:`loop_key`. ``grant`` is what the authority decided for this peer under the
    serving configuration (``_authority.py``); an in-process caller is an operator.
    """

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    session: str | None = None
    groups: frozenset[int] | None = None
    grant: Grant = OPERATOR

    @property
    def loop_key(self) -> str | None:
        """What loop detection counts by: the session; else, for an agent, its uid and
        grant (a new process starts no fresh count); else the peer (uid and pid)."""
        if self.session is not None:
            return self.session
        if self.pid is None:  # in process, or a bearer token's (counted by its token)
            return self._grant_key if self.grant.token is not None else None
        return self._grant_key or f"peer:{self.uid}:{self.pid}"

    @property
    def acts_as_agent(self) -> bool:
        """Whether this caller acts as an agent: an agent's grant (bound or unbound
        non-operator peer, token, narrowed bridge, engine) or an agent session named."""
        return self.grant.role == "agent" or self.session is not None

    @property
    def agent_key(self) -> str | None:
        """For an agent in a session, the count its sessions share (uid and grant), so
        making up a new session name starts no fresh count; None otherwise."""
        return None if self.session is None else self._grant_key

    @property
    def _grant_key(self) -> str | None:
        """An agent's count by uid and grant; None for a caller that is no agent."""
        tag = self.grant.tag
        if tag is not None and self.grant.token is not None:  # a token is its own caller
            return tag
        return None if tag is None or self.uid is None else f"{tag}:{self.uid}"
