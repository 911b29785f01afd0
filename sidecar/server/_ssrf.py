"""The built-in SSRF guard (``capd:ssrf_guard``): no URL parameter may reach inside.

An agent that can make a capability fetch a URL can aim it at the host's own
services or at a cloud metadata endpoint. Before such a call runs, every
URL-typed parameter is parsed and its host resolved (DNS included); the call is
refused when any address it resolves to is loopback, link-local (the metadata
address 169.254.169.254 among them), private, carrier-grade NAT, multicast,
reserved or unspecified, unless the host or the address is on the allowlist
(``[policy.ssrf] allow = ["localhost", "10.1.0.0/16", "*.corp.example"]``).

URL-typed means: a parameter whose JSON Schema says ``format: uri`` (pydantic's
``AnyUrl``, ``HttpUrl``...), or a string parameter named ``url`` or ``*_url``.
The op resolves the name again when it connects; a DNS answer that changes in
between (rebinding) is outside what a before-call check can see.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from pydantic import AnyUrl, BaseModel

from capd.registry import Blocked, Capability

from ._services import Caller

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str], Awaitable[list[str]]]

# Addresses no public service has; `is_global` misses none of these but is spelled out
# so the refusal can say what the address is.
_KINDS: tuple[tuple[str, Callable[[Address], bool]], ...] = (
    ("the unspecified address", lambda a: a.is_unspecified),
    ("a loopback address", lambda a: a.is_loopback),
    ("a link-local address (where cloud metadata services answer)", lambda a: a.is_link_local),
    ("a private address", lambda a: a.is_private),
    ("a multicast address", lambda a: a.is_multicast),
    ("a reserved address", lambda a: a.is_reserved),
    ("not a globally routable address", lambda a: not a.is_global),
)


async def _system_resolve(host: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def url_parameters(cap: Capability, params: BaseModel) -> list[tuple[str, str]]:
    """The (where, URL) pairs of ``params`` that are URL-typed, at any depth.

    A URL is a pydantic URL value (``AnyUrl``, ``HttpUrl``... wherever it sits: a
    list, a nested model, a dict), a string field the schema marks ``format: uri``,
    or a string under a key named ``url``/``*_url`` (or in a list named
    ``urls``/``*_urls``) at any depth.
    """
    formats = _uri_fields(cap.parameters)
    out: list[tuple[str, str]] = []

    def walk(where: str, key: str, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, AnyUrl):
            out.append((where, str(value)))
        elif isinstance(value, str):
            if key in formats or key == "url" or key.endswith("_url"):
                out.append((where, value))
        elif isinstance(value, BaseModel):
            for name, item in value:
                walk(f"{where}.{name}" if where else name, name, item)
            for name, item in (value.model_extra or {}).items():
                walk(f"{where}.{name}" if where else name, name, item)
        elif isinstance(value, dict):
            for name, item in value.items():
                walk(f"{where}.{name}", str(name), item)
        elif isinstance(value, list | tuple | set | frozenset):
            plural = key == "urls" or key.endswith("_urls")
            for i, item in enumerate(value):
                walk(f"{where}[{i}]", "url" if plural else key, item)

    walk("", "", params)
    return out


@functools.lru_cache(maxsize=1024)
def _uri_fields(model: type[BaseModel]) -> frozenset[str]:
    """Top-level fields the model's schema marks ``format: uri`` (cached per model)."""
    props = model.model_json_schema().get("properties", {})
    names = set()
    for name, spec in props.items():
        formats = {spec.get("format")} | {s.get("format") for s in spec.get("anyOf", ())}
        if "uri" in formats:
            names.add(name)
    return frozenset(names)


class SsrfGuard:
    """A before-call hook refusing URLs that resolve inside; see the module's docstring."""

    __qualname__ = "capd:ssrf_guard"

    def __init__(self, allow: Iterable[str] = (), *,
                 resolve: Resolver = _system_resolve) -> None:
        self._hosts: list[str] = []
        self._networks: list[Network] = []
        for entry in allow:
            try:
                self._networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self._hosts.append(entry.lower().rstrip("."))
        self._resolve = resolve

    def _host_allowed(self, host: str) -> bool:
        return any(fnmatch.fnmatchcase(host, pattern) for pattern in self._hosts)

    def _address_allowed(self, address: Address) -> bool:
        return any(address in network for network in self._networks)

    async def __call__(self, cap: Capability, params: BaseModel, caller: Caller) -> None:
        for name, url in url_parameters(cap, params):
            await self.check(name, url)

    async def check(self, name: str, url: str) -> None:
        """Raise :class:`Blocked` if ``url`` may reach an inside address."""
        authority = url.split("://", 1)[-1].split("/", 1)[0]
        if "\\" in authority or any(ord(c) < 0x21 or ord(c) == 0x7F for c in authority):
            raise Blocked(f"parameter {name!r}: {url!r} has a backslash or a control character "
                          "in its host part, which URL parsers read differently; the SSRF guard "
                          "refuses it")
        try:
            host = urlsplit(url).hostname
        except ValueError as exc:
            raise Blocked(f"parameter {name!r}: {url!r} is not a URL capd can check "
                          f"({exc}); the SSRF guard refuses it") from exc
        if not host:
            raise Blocked(f"parameter {name!r}: {url!r} names no host; the SSRF guard refuses "
                          "it")
        host = host.lower().rstrip(".")
        if self._host_allowed(host):
            return
        try:
            addresses = [host] if _is_address(host) else await self._resolve(host)
        except OSError as exc:
            raise Blocked(f"parameter {name!r}: the host {host!r} does not resolve ({exc}); "
                          "the SSRF guard refuses what it cannot check") from exc
        if not addresses:
            raise Blocked(f"parameter {name!r}: the host {host!r} resolves to nothing")
        for text in addresses:
            address = ipaddress.ip_address(text.split("%", 1)[0])
            if isinstance(address, ipaddress.IPv6Address):
                # an IPv4 address carried inside an IPv6 one is judged as itself
                embedded = address.ipv4_mapped or address.sixtofour or (
                    address.teredo[1] if address.teredo else None)
                if embedded is not None:
                    address = embedded
            if self._address_allowed(address):
                continue
            for kind, test in _KINDS:
                if test(address):
                    via = "" if text == host else f" (it resolves to {text})"
                    raise Blocked(
                        f"parameter {name!r}: {host}{via} is {kind}; the SSRF guard "
                        "refuses URLs that reach inside. If this host is meant to be "
                        "reachable, add it to [policy.ssrf] allow in capd.toml.")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def ssrf_guard(allow: Iterable[str] = (), **kwargs: Any) -> SsrfGuard:
    """The built-in guard with an allowlist."""
    return SsrfGuard(allow, **kwargs)
