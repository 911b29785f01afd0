"""An HTTP client for ops that an agent cannot aim inside: redirects and rebinding included.

::

    async with GuardedHttp(allow=["api.corp.example"]) as http:
        answer = await http.get(params.link)
        answer.raise_for_status()
        return answer.text()

For each hop (the URL asked for, then every redirect it is sent to) the client
reads the URL's host as :func:`read_url` does, resolves it **once**, refuses the
hop (:class:`SsrfRefused`) if any address is inside and not allowed, and then
connects to one of exactly those addresses: aiohttp's resolver is replaced by
one that answers only what was checked, so a DNS answer that changes between
the check and the connection (rebinding) is never used. The request carries
the URL's own host name in ``Host`` and, over TLS, as the SNI name the
certificate is verified against.

Redirects (301, 302, 303, 307, 308) are followed by the client itself, at most
``max_redirects`` of them, each to ``http:`` or ``https:`` only; 303, and 301/302
after a POST, continue as GET without a body; ``Authorization`` and ``Cookie``
are dropped when the origin changes. A body is read up to ``max_body_bytes``
(after decompression); the whole request, redirects included, runs under
``timeout_s``. No proxy from the environment is used and no cookie is kept.

Errors (see :mod:`._netguard`): :class:`SsrfRefused` (blocked),
:class:`HttpLimitExceeded` (permanent), :class:`HttpUnreachable` and
:class:`HttpTimeout` (transient network failures). Cancelling a request closes
its connection and propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.message
import json as jsonlib
import socket
import ssl
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.tracing import Trace
from yarl import URL

from ._netguard import (
    HttpLimitExceeded,
    HttpTimeout,
    HttpUnreachable,
    NetGuard,
    Resolver,
    SsrfRefused,
    resolve_system,
)
from ._outcomes import PermanentToolError, TransientToolError
from ._urls import Address, UrlHost, read_url

_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_TRANSIENT_STATUSES: Final = frozenset({408, 425, 429})
_CREDENTIALS: Final = ("authorization", "cookie", "proxy-authorization")
_UNSET: Final[Any] = object()
_CHUNK_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class GuardedResponse:
    """What the last hop answered, read whole (up to the client's ``max_body_bytes``).

    ``url`` is the URL that answered (after redirects), ``address`` the IP address
    the connection went to, ``redirects`` every URL redirected to, in order.
    """

    method: str
    url: str
    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    address: str
    redirects: tuple[str, ...] = ()

    def text(self, encoding: str | None = None) -> str:
        """The body decoded by ``encoding``, else the ``Content-Type`` charset, else UTF-8
        (undecodable bytes replaced)."""
        content_type = email.message.Message()
        content_type["Content-Type"] = self.headers.get("Content-Type", "")
        charset = encoding or content_type.get_content_charset() or "utf-8"
        try:
            return self.body.decode(charset, errors="replace")
        except LookupError:  # a charset Python does not know
            return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON; raises ``ValueError`` when it is not JSON."""
        return jsonlib.loads(self.body)

    def raise_for_status(self) -> None:
        """Raise the outcome an error status means for the call; do nothing below 400.

        408, 425, 429 and 5xx raise :class:`TransientToolError` (with ``retry_after_s``
        from a numeric ``Retry-After``); any other 4xx :class:`PermanentToolError`.
        """
        if self.status < 400:
            return
        message = f"{self.method} {self.url} answered {self.status} {self.reason}".rstrip()
        if self.status >= 500 or self.status in _TRANSIENT_STATUSES:
            retry_after = self.headers.get("Retry-After", "")
            raise TransientToolError(message, retry_after_s=float(retry_after)
                                     if retry_after.isdigit() else None)
        raise PermanentToolError(message)


class _PinnedResolver(AbstractResolver):
    """aiohttp's resolver, answering only the addresses the guard checked for a host.

    A host that was not pinned is an error, never a lookup: every connection the
    client makes goes to an address that was judged.
    """

    def __init__(self) -> None:
        self._pins: dict[str, list[tuple[Address, ...]]] = {}

    @contextlib.contextmanager
    def pinned(self, host: str, addresses: tuple[Address, ...]) -> Iterator[None]:
        """Pin ``host`` to ``addresses`` for the duration (the latest pin wins; all checked)."""
        pins = self._pins.setdefault(host, [])
        pins.append(addresses)
        try:
            yield
        finally:
            pins.remove(addresses)
            if not pins:
                del self._pins[host]

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_UNSPEC) -> list[ResolveResult]:
        pins = self._pins.get(host.rstrip(".").lower())
        if not pins:
            raise OSError(f"{host} was not checked by the guard; the guarded client does not "
                          "resolve it")
        kinds = {4: socket.AF_INET, 6: socket.AF_INET6}
        found: list[ResolveResult] = [
            {"hostname": host, "host": str(address), "port": port,
             "family": kinds[address.version], "proto": 0, "flags": socket.AI_NUMERICHOST}
            for address in pins[-1] if family in (socket.AF_UNSPEC, kinds[address.version])]
        if not found:
            raise OSError(f"{host} has no checked address of the family asked for")
        return found

    async def close(self) -> None:
        self._pins.clear()


# Where the connection a request was handed goes: set around one exchange, read by the
# connector in the same task (a pooled connection included).
_peers: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "capd_guarded_http_peers", default=None)


class _PeerNotingConnector(aiohttp.TCPConnector):
    """aiohttp's connector, noting the peer address of each connection it hands out."""

    async def connect(self, req: aiohttp.ClientRequest, traces: list[Trace],
                      timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp passes timeout=
                      ) -> aiohttp.connector.Connection:
        connection = await super().connect(req, traces, timeout)
        sink = _peers.get()
        transport = connection.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        if sink is not None and peer:
            sink.append(str(peer[0]))
        return connection


@dataclass
class _Hop:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    redirects: list[str] = field(default_factory=list)


class GuardedHttp:
    """An async HTTP client whose every connection goes to an address the guard checked.

    ``allow`` takes what ``[policy.ssrf] allow`` takes (host names, globs, networks);
    ``resolve`` replaces the system resolver (a test's seam). ``max_redirects``,
    ``max_body_bytes``, ``timeout_s`` (the whole request, redirects included) and
    ``connect_timeout_s`` bound the work; ``tls`` replaces the default verifying TLS
    context (a private CA); ``headers`` go with every request.

    Use it as ``async with GuardedHttp(...) as http:`` or call :meth:`aclose`; the
    connection pool is made on the first request, on the running loop.
    """

    def __init__(self, allow: Iterable[str] = (), *, resolve: Resolver = resolve_system,
                 max_redirects: int = 5, max_body_bytes: int = 10 * 1024 * 1024,
                 timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 tls: ssl.SSLContext | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        if max_redirects < 0 or max_body_bytes <= 0 or timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("max_redirects must be 0 or more; max_body_bytes, timeout_s and "
                             "connect_timeout_s above 0")
        self._guard = NetGuard(allow, resolve=resolve,
                               resolve_timeout_s=min(connect_timeout_s, timeout_s))
        self._max_redirects = max_redirects
        self._max_body_bytes = max_body_bytes
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._tls = tls
        self._headers = {"User-Agent": "capd-guarded-http", **(headers or {})}
        self._resolver = _PinnedResolver()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> GuardedHttp:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pool and its connections; later requests raise ``RuntimeError``."""
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _pool(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("this GuardedHttp is closed")
        if self._session is None:
            connector = _PeerNotingConnector(resolver=self._resolver, use_dns_cache=False,
                                             ssl=self._tls if self._tls is not None else True)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s))
        return self._session

    async def get(self, url: str, *, headers: Mapping[str, str] | None = None
                  ) -> GuardedResponse:
        """``GET url``; see :meth:`request`."""
        return await self.request("GET", url, headers=headers)

    async def post(self, url: str, *, headers: Mapping[str, str] | None = None,
                   data: bytes | str | None = None, json: Any = _UNSET) -> GuardedResponse:
        """``POST url`` with ``data`` or ``json``; see :meth:`request`."""
        return await self.request("POST", url, headers=headers, data=data, json=json)

    async def request(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
                      data: bytes | str | None = None, json: Any = _UNSET) -> GuardedResponse:
        """Send ``method url`` (``data`` as the body, or ``json`` serialised), following
        redirects, and return the last answer whatever its status.

        Raises :class:`SsrfRefused` when the URL or a redirect hop reaches inside (or is
        not an ``http:``/``https:`` URL), :class:`HttpLimitExceeded` past a bound,
        :class:`HttpUnreachable` when a host does not resolve or a connection fails, and
        :class:`HttpTimeout` past ``timeout_s``.
        """
        if data is not None and json is not _UNSET:
            raise ValueError("pass data or json, not both")
        sent = {**self._headers, **(headers or {})}
        body: bytes | None = data.encode() if isinstance(data, str) else data
        if json is not _UNSET:
            body = jsonlib.dumps(json).encode()
            if not any(k.lower() == "content-type" for k in sent):
                sent["Content-Type"] = "application/json"
        hop = _Hop(method.upper(), url, sent, body)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._follow(hop)
        except HttpTimeout:
            raise
        except TimeoutError as exc:
            raise HttpTimeout(f"{hop.method} {url} did not finish within "
                              f"{self._timeout_s:g}s") from exc

    async def _follow(self, hop: _Hop) -> GuardedResponse:
        first = hop.url
        while True:
            where = (f"{hop.method} {first} redirected (hop {len(hop.redirects)}) to {hop.url}"
                     if hop.redirects else f"{hop.method} {hop.url}")
            target = _read(hop.url, where)
            addresses = await self._check(target, where)
            request_url = _request_url(target, where)
            with self._resolver.pinned(target.host, addresses):
                answer = await self._send(hop, target, request_url, where)
            if isinstance(answer, GuardedResponse):
                return answer
            status, location = answer
            if len(hop.redirects) >= self._max_redirects:
                raise HttpLimitExceeded(f"{hop.method} {first} redirected more than "
                                        f"{self._max_redirects} times (the last to {location})")
            _redirect(hop, status, location, request_url)

    async def _check(self, target: UrlHost, where: str) -> tuple[Address, ...]:
        """Resolve ``target``'s host once and judge it; the addresses to connect to."""
        try:
            addresses = await self._guard.addresses(target)
        except OSError as exc:
            why = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise HttpUnreachable(f"{where}: the host {target.host!r} does not resolve "
                                  f"({why})") from exc
        try:
            self._guard.judge(target, addresses)
        except SsrfRefused as refusal:
            raise refusal.restate(
                f"{where}: {refusal.reason}; the guarded HTTP client refuses addresses "
                "inside. If this host is meant to be reachable, add it to the client's "
                "allowlist: GuardedHttp(allow=[...]).") from refusal
        return addresses

    async def _send(self, hop: _Hop, target: UrlHost, request_url: URL, where: str
                    ) -> GuardedResponse | tuple[int, str]:
        """One exchange: the response, or a redirect's status and ``Location``."""
        peers: list[str] = []
        noting = _peers.set(peers)
        try:
            async with self._pool().request(
                    hop.method, request_url, headers=hop.headers, data=hop.body,
                    allow_redirects=False) as response:
                location = response.headers.get("Location")
                if response.status in _REDIRECTS and location:
                    return response.status, location
                body = await self._read_body(response, where)
                return GuardedResponse(
                    method=hop.method, url=hop.url, status=response.status,
                    reason=response.reason or "", headers=response.headers, body=body,
                    address=peers[-1] if peers else "", redirects=tuple(hop.redirects))
        except aiohttp.ClientConnectorCertificateError as exc:
            raise HttpUnreachable(f"{where}: the TLS certificate of {target.host} did not "
                                  f"verify ({exc.certificate_error})") from exc
        except aiohttp.ClientConnectorError as exc:
            raise HttpUnreachable(f"{where}: cannot connect to {target.host} "
                                  f"({exc.os_error.strerror or exc.os_error})") from exc
        except TimeoutError as exc:  # aiohttp's connect timeout (ours is outside)
            raise HttpTimeout(f"{where}: {target.host} did not accept a connection within "
                              f"{self._connect_timeout_s:g}s") from exc
        except aiohttp.ClientError as exc:
            raise HttpUnreachable(f"{where}: the exchange with {target.host} failed "
                                  f"({type(exc).__name__}: {exc})") from exc
        finally:
            _peers.reset(noting)

    async def _read_body(self, response: aiohttp.ClientResponse, where: str) -> bytes:
        declared = response.content_length
        if declared is not None and declared > self._max_body_bytes:
            raise HttpLimitExceeded(f"{where}: the answer declares {declared} bytes, more than "
                                    f"max_body_bytes ({self._max_body_bytes})")
        body = bytearray()
        async for chunk in response.content.iter_chunked(_CHUNK_BYTES):
            body += chunk
            if len(body) > self._max_body_bytes:
                raise HttpLimitExceeded(f"{where}: the answer is longer than max_body_bytes "
                                        f"({self._max_body_bytes})")
        return bytes(body)


def _read(url: str, where: str) -> UrlHost:
    """Our reading of ``url``: what is judged and connected to. http: and https: only."""
    try:
        target = read_url(url)
    except ValueError as exc:
        raise SsrfRefused(str(exc), url=url, message=(
            f"{where}: {exc}; the guarded HTTP client refuses it")) from exc
    if target is None or target.scheme not in ("http", "https"):
        raise SsrfRefused(f"{url!r} is not an http: or https: URL", url=url, message=(
            f"{where}: {url!r} is not an absolute http: or https: URL; the guarded HTTP "
            "client speaks nothing else"))
    return target


def _request_url(target: UrlHost, where: str) -> URL:
    """The URL aiohttp sends: the path and query as yarl reads them, the host and port as
    :func:`read_url` does, so that what is connected to is what was judged."""
    problem = "it does not read as an absolute URL of the same scheme"
    try:
        parsed = URL(target.url.strip())
        if parsed.absolute and parsed.scheme.lower() == target.scheme:
            request_url = parsed.with_host(target.host)
            return request_url if target.port is None else request_url.with_port(target.port)
    except ValueError as exc:
        problem = str(exc)
    raise SsrfRefused(f"{target.url!r} is read differently by the HTTP library ({problem})",
                      url=target.url, message=(
                          f"{where}: the HTTP library reads {target.url!r} differently "
                          f"({problem}); the guarded HTTP client refuses it"))


def _redirect(hop: _Hop, status: int, location: str, current: URL) -> None:
    """Turn ``hop`` into the request a redirect to ``location`` asks for (RFC 9110 §15.4)."""
    try:
        following = current.join(URL(location))
    except ValueError as exc:
        raise SsrfRefused(f"the redirect to {location!r} is not a URL ({exc})", url=location,
                          message=f"{hop.url} redirected to {location!r}, which is not a URL "
                          "the guarded HTTP client can read") from exc
    if (status == 303 and hop.method != "HEAD") or (status in (301, 302)
                                                    and hop.method == "POST"):
        hop.method, hop.body = "GET", None  # as every client does
        hop.headers = {k: v for k, v in hop.headers.items()
                       if k.lower() not in ("content-type", "content-length")}
    same_origin = False
    with contextlib.suppress(ValueError):  # a URL without an origin is another origin
        same_origin = current.origin() == following.origin()
    if not same_origin:
        hop.headers = {k: v for k, v in hop.headers.items() if k.lower() not in _CREDENTIALS}
    hop.url = str(following)
    hop.redirects.append(hop.url)


async def guarded_fetch(url: str, *, method: str = "GET", allow: Iterable[str] = (),
                        headers: Mapping[str, str] | None = None,
                        data: bytes | str | None = None, json: Any = _UNSET,
                        resolve: Resolver = resolve_system, max_redirects: int = 5,
                        max_body_bytes: int = 10 * 1024 * 1024, timeout_s: float = 30.0,
                        connect_timeout_s: float = 10.0,
                        tls: ssl.SSLContext | None = None) -> GuardedResponse:
    """One request with a client of its own, closed after: :class:`GuardedHttp` with these
    settings, then :meth:`GuardedHttp.request`, whose errors it raises."""
    async with GuardedHttp(allow, resolve=resolve, max_redirects=max_redirects,
                           max_body_bytes=max_body_bytes, timeout_s=timeout_s,
                           connect_timeout_s=connect_timeout_s, tls=tls) as http:
        return await http.request(method, url, headers=headers, data=data, json=json)
