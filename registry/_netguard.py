"""Which addresses an agent may make capd reach, and the errors of refusing the rest.

An address is *inside* when it is unspecified, loopback, link-local (the cloud
metadata address 169.254.169.254 among them), carrier-grade NAT, private,
site-local, multicast, reserved, or otherwise not globally routable. An IPv6
address that carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, NAT64
``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo) is judged as the IPv4 address it
carries; the local-use NAT64 prefix ``64:ff9b:1::/48`` is inside by itself.

:class:`NetGuard` holds an allowlist (host names, ``*`` globs, networks) and a
resolver, and judges a URL's host: every address it resolves to must be public
or allowlisted. The SSRF guard (``capd:ssrf_guard``) and :class:`GuardedHttp`
both judge through it. Its errors::

    RegistryError
    └── NetGuardError           root of the network guard's errors
        ├── SsrfRefused         (a Blocked) the URL, or a redirect hop, reaches inside
        ├── HttpLimitExceeded   (a PermanentToolError) too many redirects, a body too large
        ├── HttpUnreachable     (a ConnectionError) no connection, or it broke: transient
        └── HttpTimeout         (a TimeoutError) no answer in time: transient

Each is also the outcome type the gateway reads (``Blocked`` → ``error_blocked``,
``PermanentToolError`` → ``error_permanent``, a connection error or a timeout →
``error_transient``, counted as a network failure), so an op lets them propagate.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence

from ._errors import RegistryError
from ._outcomes import Blocked, PermanentToolError
from ._urls import Address, UrlHost

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: Resolves a host name to its addresses (as text); raises ``OSError`` when it cannot.
Resolver = Callable[[str], Awaitable[list[str]]]


class NetGuardError(RegistryError):
    """Root of the network guard's errors."""


class SsrfRefused(NetGuardError, Blocked):
    """A URL (or a redirect hop) would reach an address the guard refuses.

    ``url`` is the URL refused, ``host`` its host (when it could be read),
    ``address`` the refused address (when one was), ``reason`` the sentence
    without context ("localhost (it resolves to 127.0.0.1) is a loopback
    address"), ``allowable`` whether an allowlist entry would let it through.
    """

    def __init__(self, reason: str, *, url: str, host: str | None = None,
                 address: str | None = None, allowable: bool = False,
                 message: str | None = None) -> None:
        Blocked.__init__(self, message or reason)
        self.reason = reason
        self.url = url
        self.host = host
        self.address = address
        self.allowable = allowable

    def restate(self, message: str) -> SsrfRefused:
        """The same refusal with a message that gives its context and the way out."""
        return SsrfRefused(self.reason, url=self.url, host=self.host, address=self.address,
                           allowable=self.allowable, message=message)


class HttpLimitExceeded(NetGuardError, PermanentToolError):
    """The guarded client gave up on a bound: too many redirects, a body too large."""


class HttpUnreachable(NetGuardError, ConnectionError):
    """The guarded client could not connect, or the connection broke (a network failure)."""


class HttpTimeout(NetGuardError, TimeoutError):
    """The guarded client's request did not finish within its ``timeout_s``."""


_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")

# `is_global` alone would catch all of these; they are spelled out so a refusal says what
# the address is. The order matters: the first that applies names it.
_KINDS: tuple[tuple[str, Callable[[Address], bool]], ...] = (
    ("the unspecified address", lambda a: a.is_unspecified),
    ("a loopback address", lambda a: a.is_loopback),
    ("a link-local address (where cloud metadata services answer)", lambda a: a.is_link_local),
    ("a carrier-grade NAT address", lambda a: a in _CGNAT),
    # 240.0.0.0/4: Python counts it private too; in IPv6 "reserved" spans fc00::/7, so
    # only IPv4's reserved range is named before "private"
    ("a reserved address", lambda a: a.version == 4 and a.is_reserved),
    ("a private address", lambda a: a.is_private),
    ("a site-local address", lambda a: isinstance(a, ipaddress.IPv6Address) and a.is_site_local),
    ("a multicast address", lambda a: a.is_multicast),
    ("a reserved address", lambda a: a.is_reserved),
    ("not a globally routable address", lambda a: not a.is_global),
)


def carried_ipv4(address: Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 one carries, with the way it carries it; else ``None``."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped, "IPv4-mapped"
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), "NAT64"
    if address.sixtofour is not None:
        return address.sixtofour, "6to4"
    if address.teredo is not None:
        return address.teredo[1], "Teredo"
    return None


def classify_address(address: Address) -> str | None:
    """What makes ``address`` inside, as a phrase ("a loopback address"); ``None`` if public.

    An IPv6 address carrying an IPv4 one is judged as that IPv4 address, and the phrase
    says so ("a loopback address: it carries 127.0.0.1 (IPv4-mapped)").
    """
    if address in _NAT64_LOCAL:
        return "a local-use NAT64 address"
    carried = carried_ipv4(address)
    judged: Address = carried[0] if carried else address
    for kind, test in _KINDS:
        if test(judged):
            return f"{kind}: it carries {judged} ({carried[1]})" if carried else kind
    return None


async def resolve_system(host: str) -> list[str]:
    """The system resolver (``getaddrinfo``), off the loop: every address, as text."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class NetGuard:
    """Judges the hosts of URLs: each address they resolve to must be public or allowed.

    ``allow`` holds host names, ``fnmatch`` globs (``*.corp.example``) and networks
    (``10.1.0.0/16``, a bare address); a host that matches a name or glob is let
    through unjudged, an address inside an allowed network is let through.
    ``resolve`` is the seam tests replace; each resolution runs under
    ``resolve_timeout_s``.
    """

    def __init__(self, allow: Iterable[str] = (), *, resolve: Resolver = resolve_system,
                 resolve_timeout_s: float = 5.0) -> None:
        self._hosts: list[str] = []
        self._networks: list[Network] = []
        for entry in allow:
            try:
                self._networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                self._hosts.append(entry.lower().rstrip("."))
        self._resolve = resolve
        self._resolve_timeout_s = resolve_timeout_s

    def host_allowed(self, host: str) -> bool:
        """Whether the canonical ``host`` matches a name or glob of the allowlist."""
        return any(fnmatch.fnmatchcase(host, pattern) for pattern in self._hosts)

    def address_allowed(self, address: Address) -> bool:
        """Whether ``address`` (or the IPv4 address it carries) is in an allowed network."""
        carried = carried_ipv4(address)
        return any(address in network or (carried is not None and carried[0] in network)
                   for network in self._networks)

    async def resolve(self, host: str) -> tuple[Address, ...]:
        """Every address ``host`` resolves to, resolved once, sorted and without repeats.

        Raises ``OSError`` when it does not resolve, resolves to nothing, answers
        something that is not an address, or takes longer than ``resolve_timeout_s``
        (a ``TimeoutError``, itself an ``OSError``).
        """
        async with asyncio.timeout(self._resolve_timeout_s):
            answers = await self._resolve(host)
        addresses: set[Address] = set()
        for text in answers:
            try:
                addresses.add(ipaddress.ip_address(text.split("%", 1)[0]))
            except ValueError as exc:
                raise OSError(f"the resolver answered {text!r}, which is not an address") from exc
        if not addresses:
            raise OSError("it resolves to no address")
        return tuple(sorted(addresses, key=lambda a: (a.version, int(a))))

    async def addresses(self, target: UrlHost) -> tuple[Address, ...]:
        """Where ``target`` points: its IP literal, else its host resolved (:meth:`resolve`,
        whose ``OSError`` it raises)."""
        if target.address is not None:
            return (target.address,)
        return await self.resolve(target.host)

    def judge(self, target: UrlHost, addresses: Sequence[Address]) -> None:
        """Raise :class:`SsrfRefused` for the first of ``addresses`` that is inside and not
        allowed, unless ``target``'s host is allowlisted by name. ``addresses`` are where
        ``target``'s host resolved (or its literal)."""
        if self.host_allowed(target.host):
            return
        for address in addresses:
            kind = classify_address(address)
            if kind is None or self.address_allowed(address):
                continue
            if target.address is not None:
                subject = target.shown
            else:
                among = "" if len(addresses) == 1 else f", one of {len(addresses)} addresses"
                subject = f"{target.host} (it resolves to {address}{among})"
            raise SsrfRefused(f"{subject} is {kind}", url=target.url, host=target.host,
                              address=str(address), allowable=True)

    async def check(self, target: UrlHost) -> tuple[Address, ...]:
        """Judge ``target``; return the addresses it was judged by (``()`` when its host is
        allowlisted by name, which is not resolved).

        Raises :class:`SsrfRefused` when an address is inside and not allowed, when the
        host does not resolve (what cannot be checked is refused), and for a ``file:``
        URL (it names this host's files, whatever its host).
        """
        if target.scheme == "file":
            raise SsrfRefused(f"{target.url!r} is a file: URL, which names this host's own "
                              "files", url=target.url, host=target.host or None)
        if self.host_allowed(target.host):
            return ()
        try:
            addresses = await self.addresses(target)
        except OSError as exc:
            why = (f"no answer within {self._resolve_timeout_s:g}s"
                   if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__)
            raise SsrfRefused(f"the host {target.host!r} does not resolve ({why})",
                              url=target.url, host=target.host, allowable=True) from exc
        self.judge(target, addresses)
        return addresses
