"""The built-in SSRF guard (``capd:ssrf_guard``): no URL an op is given may reach inside.

An agent that can make a capability fetch a URL can aim it at the host's own
services or at a cloud metadata endpoint. Before such a call runs, the guard
looks at what the op will see: every string value of the parameters, under any
key and at any depth (nested models, ``model_extra``, computed fields, dicts and
their keys, lists, tuples, sets, dataclasses, enum values), and every pydantic
URL value. Each one that reads as an absolute URL with a host
(``capd.registry.read_url``: any scheme with ``//host``, WHATWG rules for
``http:``/``https:``/``ws:``/``wss:``/``ftp:``, numeric IPv4 forms, IPv6
literals, userinfo, IDNA, trailing dots) has its host resolved; the call is
refused when any address it resolves to is inside (``capd.registry.NetGuard``:
loopback, link-local, carrier-grade NAT, private, multicast, reserved,
unspecified, also when carried in IPv6), when the host does not resolve, when
the URL cannot be read unambiguously, and for every ``file:`` URL (it names this
host's own files). A host or address on the allowlist passes (``[policy.ssrf]
allow = ["localhost", "10.1.0.0/16", "*.corp.example"]``); each distinct host is
resolved once per call.

What a before-call check cannot see: the op resolves the name again when it
connects (a DNS answer that changes in between, rebinding, is beyond it), and a
redirect the op's HTTP client follows is never shown to it. An op that fetches
with :class:`capd.registry.GuardedHttp` is protected from both. A URL inside
prose ("see http://10.0.0.1/") and a host without a scheme ("10.0.0.1:8080")
are not URLs to the guard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from pydantic import BaseModel

from capd.registry import Blocked, Capability, NetGuard, SsrfRefused, UrlHost, read_url

from ._grant import Caller

#: Resolves a host name to its addresses (as text); raises ``OSError`` when it cannot.
Resolver = Callable[[str], Awaitable[list[str]]]

#: Deeper parameters than this are refused: what the guard cannot walk it cannot check.
MAX_DEPTH = 64
#: Host resolutions one call runs at a time.
_CONCURRENT_RESOLUTIONS = 16

_ALLOW_HINT = "If this host is meant to be reachable, add it to [policy.ssrf] allow in capd.toml."


def string_values(params: BaseModel) -> Iterator[tuple[str, str]]:
    """Every (where, text) pair the op can read as a string, in field order.

    ``where`` names the place (``link``, ``target.url``, ``links[2]``,
    ``meta.home``, ``meta (a key)``). A pydantic URL value yields its text; a
    multi-host one (``PostgresDsn``) yields one URL per host. Raises
    :class:`Blocked` for a value nested deeper than :data:`MAX_DEPTH`.
    """
    yield from _walk("", params, 0)


def _walk(where: str, value: Any, depth: int) -> Iterator[tuple[str, str]]:
    if depth > MAX_DEPTH:
        raise Blocked(f"parameter {where!r} is nested deeper than {MAX_DEPTH} levels; the SSRF "
                      "guard refuses what it cannot inspect")
    if value is None or isinstance(value, bool | int | float):
        return
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, bytes | bytearray):
        yield where, bytes(value).decode("latin-1")
    elif isinstance(value, enum.Enum):
        yield from _walk(where, value.value, depth + 1)
    elif callable(getattr(value, "hosts", None)) and hasattr(value, "scheme"):
        for host in value.hosts():  # pydantic's multi-host URLs (PostgresDsn...)
            port = f":{host['port']}" if host.get("port") else ""
            yield where, f"{value.scheme}://{host.get('host') or ''}{port}/"
    elif hasattr(value, "unicode_string") and hasattr(value, "scheme"):
        yield where, str(value)  # pydantic's AnyUrl, HttpUrl...
    elif isinstance(value, BaseModel):
        yield from _walk_fields(where, value, depth)
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            if isinstance(key, str):
                yield f"{where or 'parameters'} (a key)", key
            yield from _walk(name, item, depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            yield from _walk(f"{where}[{i}]", item, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _walk(_join(where, field.name), getattr(value, field.name, None),
                             depth + 1)


def _walk_fields(where: str, model: BaseModel, depth: int) -> Iterator[tuple[str, str]]:
    for name in type(model).model_fields:
        yield from _walk(_join(where, name), getattr(model, name, None), depth + 1)
    for name, item in (model.model_extra or {}).items():
        yield from _walk(_join(where, name), item, depth + 1)
    for name in type(model).model_computed_fields:
        try:
            item = getattr(model, name)
        except Exception:  # the op would meet the same failure: nothing here to check
            continue
        yield from _walk(_join(where, name), item, depth + 1)


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def find_urls(params: BaseModel) -> list[tuple[str, UrlHost]]:
    """The values of ``params`` that read as absolute URLs with a host, with where they are.

    Raises :class:`SsrfRefused` naming the parameter for a value that looks like a
    URL but cannot be read unambiguously (a backslash in the host, a bad IPv4 form).
    """
    return [(where, target) for where, text in string_values(params)
            if (target := _read(where, text)) is not None]


def _read(where: str, text: str) -> UrlHost | None:
    """``text`` as an absolute URL with a host (None: not one); raise :class:`SsrfRefused`
    for one that cannot be read unambiguously."""
    try:
        return read_url(text)
    except ValueError as exc:
        raise SsrfRefused(str(exc), url=text, message=(
            f"parameter {where!r}: {exc}; the SSRF guard refuses it")) from exc


class SsrfGuard:
    """A before-call hook refusing URLs that reach inside; see the module's docstring."""

    __qualname__ = "capd:ssrf_guard"

    def __init__(self, allow: Iterable[str] = (), *, resolve: Resolver | None = None) -> None:
        self._guard = NetGuard(allow) if resolve is None else NetGuard(allow, resolve=resolve)

    async def __call__(self, cap: Capability, params: BaseModel, caller: Caller) -> None:
        found = find_urls(params)
        if not found:
            return
        # One judgement per distinct host as written, run side by side; the refusal
        # reported is the first in the parameters' order.
        limit = asyncio.Semaphore(_CONCURRENT_RESOLUTIONS)
        firsts: dict[tuple[str, str, str], UrlHost] = {}
        for _, target in found:
            firsts.setdefault(_key(target), target)

        async def judge(target: UrlHost) -> SsrfRefused | None:
            async with limit:
                try:
                    await self._guard.check(target)
                except SsrfRefused as refusal:
                    return refusal
                return None

        verdicts = dict(zip(firsts, await asyncio.gather(*map(judge, firsts.values())),
                            strict=True))
        for where, target in found:
            refusal = verdicts[_key(target)]
            if refusal is not None:
                raise _explain(where, refusal) from refusal

    async def check(self, where: str, url: str) -> None:
        """Raise :class:`Blocked` (an :class:`SsrfRefused`) if ``url`` may reach inside,
        or is not an absolute URL with a host."""
        target = _read(where, url)
        if target is None:
            raise SsrfRefused(f"{url!r} is not an absolute URL with a host", url=url, message=(
                f"parameter {where!r}: {url!r} is not an absolute URL with a host; the SSRF "
                "guard refuses what it cannot check"))
        try:
            await self._guard.check(target)
        except SsrfRefused as refusal:
            raise _explain(where, refusal) from refusal


def _key(target: UrlHost) -> tuple[str, str, str]:
    return target.scheme if target.scheme == "file" else "", target.host, target.written


def _explain(where: str, refusal: SsrfRefused) -> SsrfRefused:
    """The refusal with the parameter that carried it and the way out."""
    if refusal.address is not None:
        advice = f"the SSRF guard refuses URLs that reach inside. {_ALLOW_HINT}"
    elif refusal.allowable:
        advice = f"the SSRF guard refuses what it cannot check. {_ALLOW_HINT}"
    else:
        advice = "the SSRF guard refuses it"
    return refusal.restate(f"parameter {where!r}: {refusal.reason}; {advice}")


def ssrf_guard(allow: Iterable[str] = (), **kwargs: Any) -> SsrfGuard:
    """The built-in guard with an allowlist."""
    return SsrfGuard(allow, **kwargs)
