"""The guarded HTTP client: every hop checked, every connection to the address checked.

Real servers on 127.0.0.1 and 127.0.0.2 (both loopback on Linux); names are answered
by resolvers injected at the edge, so nothing leaves the machine. Where a test needs
an address to count as public it allowlists 127.0.0.1 and leaves 127.0.0.2 inside.
"""

from __future__ import annotations

import asyncio
import datetime
import errno
import socket
import ssl
import textwrap
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohappyeyeballs
import pytest
from aiohttp import web
from pydantic import BaseModel

from capd.recovery import call_capability
from capd.registry import (
    Blocked,
    GuardedHttp,
    HttpLimitExceeded,
    HttpTimeout,
    HttpUnreachable,
    NetGuardError,
    PermanentToolError,
    SsrfRefused,
    TransientToolError,
    guarded_fetch,
)
from capd.sidecar.client._client import request
from tests.helpers.daemon import DaemonProcess
from tests.helpers.fakes import make_registry
from tests.helpers.servers import QuietHandler, ThreadedHttp
from tests.helpers.text import fullwidth

ALLOW_ONE = ["127.0.0.1/32"]  # 127.0.0.1 plays a public address; 127.0.0.2 stays inside


class Site:
    """A real aiohttp server on one loopback address; it records every request it gets."""

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.seen: list[dict[str, Any]] = []
        self.hold = asyncio.Event()
        self._runner: web.AppRunner | None = None

    def url(self, path: str = "/", host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}{path}"

    async def _any(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("sockname") if request.transport else None
        self.seen.append({"method": request.method, "path": request.path_qs,
                          "host": request.headers.get("Host"), "local": peer[0] if peer else None,
                          "headers": dict(request.headers), "body": await request.read()})
        path = request.path
        if path == "/redirect":
            status = int(request.query.get("status", "302"))
            return web.Response(status=status, headers={"Location": request.query["to"]})
        if path == "/loop":
            return web.Response(status=302, headers={"Location": "/loop"})
        if path == "/big":
            return web.Response(body=b"x" * 5000)
        if path == "/stream":
            response = web.StreamResponse()
            await response.prepare(request)
            for _ in range(10):
                await response.write(b"y" * 500)
            await response.write_eof()
            return response
        if path == "/hold":
            await self.hold.wait()
        if path == "/status":
            return web.Response(status=int(request.query["code"]), headers={"Retry-After": "7"})
        return web.Response(text=f"from {self.name}")

    async def start(self, tls: ssl.SSLContext | None = None) -> Site:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, ssl_context=tls).start()
        return self

    async def stop(self) -> None:
        self.hold.set()
        if self._runner is not None:
            await self._runner.cleanup()


class Resolve:
    """A resolver at the edge: answers from a table (a list of answers is used in turn,
    the last one repeating); every question is counted."""

    def __init__(self, **table: str | list[str]) -> None:
        self.table = {k.replace("_", "."): v for k, v in table.items()}
        self.calls: Counter[str] = Counter()

    async def __call__(self, host: str) -> list[str]:
        self.calls[host] += 1
        answer = self.table.get(host)
        if answer is None:
            raise OSError(f"Name or service not known: {host}")
        if isinstance(answer, list):
            return [answer[min(self.calls[host], len(answer)) - 1]]
        return [answer]


@pytest.fixture
async def sites() -> AsyncIterator[Callable[..., Awaitable[Site]]]:
    started: list[Site] = []

    async def start(name: str, host: str = "127.0.0.1", port: int = 0,
                    tls: ssl.SSLContext | None = None) -> Site:
        site = await Site(name, host, port).start(tls)
        started.append(site)
        return site

    yield start
    for site in started:
        await site.stop()


# ------------------------------------------------------------------- checked, then connected


async def test_a_name_resolving_to_an_allowed_address_is_fetched_from_it(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """One lookup, a connection to that address, and the name kept in the Host header."""
    site = await sites("good")
    resolve = Resolve(svc_example="127.0.0.1")
    async with GuardedHttp(ALLOW_ONE, resolve=resolve) as http:
        answer = await http.get(site.url("/hello", host="svc.example"))
    assert (answer.status, answer.text(), answer.address) == (200, "from good", "127.0.0.1")
    assert site.seen[0]["host"] == f"svc.example:{site.port}"
    assert resolve.calls == Counter({"svc.example": 1})


async def test_a_name_resolving_inside_is_refused_before_any_connection(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """The refusal is a Blocked that says which address and how to allow it."""
    site = await sites("inside")
    resolve = Resolve(svc_example="127.0.0.1")
    async with GuardedHttp(resolve=resolve) as http:
        with pytest.raises(SsrfRefused) as caught:
            await http.get(site.url(host="svc.example"))
    assert caught.value.message == (
        f"GET http://svc.example:{site.port}/: svc.example (it resolves to 127.0.0.1) is a "
        "loopback address; the guarded HTTP client refuses addresses inside. If this host is "
        "meant to be reachable, add it to the client's allowlist: GuardedHttp(allow=[...]).")
    assert isinstance(caught.value, Blocked)
    assert isinstance(caught.value, NetGuardError)
    assert site.seen == []


@pytest.mark.parametrize("host", [
    "127.0.0.1", "2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0x7f000001", "127.0.0.1.",
    "example.com@127.0.0.1", "LOCALHOST.", fullwidth("localhost"), "%31%32%37.0.0.1",
])
async def test_every_spelling_of_an_inside_address_is_refused(
        sites: Callable[..., Awaitable[Site]], host: str) -> None:
    """Numeric IPv4 forms, userinfo, trailing dots, case and IDNA: all refused, none sent."""
    site = await sites("inside")
    resolve = Resolve(localhost="127.0.0.1", example_com="93.184.216.34")
    with pytest.raises(SsrfRefused, match="loopback"):
        await guarded_fetch(f"http://{host}:{site.port}/", resolve=resolve)
    assert site.seen == []
    assert "example.com" not in resolve.calls  # the userinfo is not the host


async def test_an_ipv6_literal_inside_is_refused(sites: Callable[..., Awaitable[Site]]) -> None:
    """[::1], also written long or IPv4-mapped, is refused and never connected to."""
    site = await sites("six", host="::1")
    for host in ("[::1]", "[0:0:0:0:0:0:0:1]", "[::ffff:127.0.0.1]"):
        with pytest.raises(SsrfRefused, match="loopback"):
            await guarded_fetch(f"http://{host}:{site.port}/", resolve=Resolve())
    assert site.seen == []


async def test_an_allowed_ipv6_literal_is_fetched(sites: Callable[..., Awaitable[Site]]) -> None:
    """An allowlisted IPv6 literal is connected to directly, without a lookup."""
    site = await sites("six", host="::1")
    resolve = Resolve()
    answer = await guarded_fetch(f"http://[::1]:{site.port}/", allow=["::1"], resolve=resolve)
    assert (answer.text(), answer.address) == ("from six", "::1")
    assert resolve.calls == Counter()


# ------------------------------------------------------------------- rebinding


async def test_a_rebinding_name_is_connected_to_the_checked_address_only(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """Checked at 127.0.0.1 (allowed), answering 127.0.0.2 afterwards: no second lookup."""
    good = await sites("good")
    evil = await sites("evil", host="127.0.0.2", port=good.port)
    resolve = Resolve(rebind_example=["127.0.0.1", "127.0.0.2"])
    async with GuardedHttp(ALLOW_ONE, resolve=resolve) as http:
        answer = await http.get(good.url(host="rebind.example"))
        assert (answer.text(), answer.address) == ("from good", "127.0.0.1")
        assert resolve.calls == Counter({"rebind.example": 1})
        assert good.seen[0]["local"] == "127.0.0.1"
        # the next request looks again, sees the new answer and refuses it
        with pytest.raises(SsrfRefused, match=r"127\.0\.0\.2"):
            await http.get(good.url(host="rebind.example"))
    assert resolve.calls == Counter({"rebind.example": 2})
    assert evil.seen == []


async def test_a_public_answer_at_check_time_is_the_only_address_dialled(
        sites: Callable[..., Awaitable[Site]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Public at the check, 127.0.0.1 afterwards: the socket is opened to the public one."""
    local = await sites("local")
    dialled: list[str] = []

    async def start_connection(addr_infos: list[Any], **_: Any) -> socket.socket:
        dialled.extend(str(info[4][0]) for info in addr_infos)
        raise OSError(errno.ENETUNREACH, "Network is unreachable")  # no network here

    monkeypatch.setattr(aiohappyeyeballs, "start_connection", start_connection)
    resolve = Resolve(rebind_example=["93.184.216.34", "127.0.0.1"])
    with pytest.raises(HttpUnreachable, match=r"cannot connect to rebind\.example"):
        await guarded_fetch(local.url(host="rebind.example"), resolve=resolve)
    assert dialled == ["93.184.216.34"]
    assert resolve.calls == Counter({"rebind.example": 1})
    assert local.seen == []


# ------------------------------------------------------------------- redirects


async def test_a_redirect_to_an_inside_address_is_refused_at_the_hop(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """An allowed server redirecting to 127.0.0.2, by address or by name, is refused."""
    front = await sites("front")
    inside = await sites("inside", host="127.0.0.2")
    resolve = Resolve(front_example="127.0.0.1", internal_example="127.0.0.2")
    for to in (inside.url("/secret"), inside.url("/secret", host="internal.example"),
               "http://169.254.169.254/latest/meta-data/", "http://0x7f000002/"):
        with pytest.raises(SsrfRefused) as caught:
            await guarded_fetch(front.url(f"/redirect?to={to}", host="front.example"),
                                allow=ALLOW_ONE, resolve=resolve)
        assert "redirected (hop 1) to" in caught.value.message
        assert caught.value.url == to
    assert inside.seen == []
    assert len(front.seen) == 4


@pytest.mark.parametrize("to", ["file:///etc/passwd", "gopher://127.0.0.1:70/_x",
                                "ftp://front.example/", "http://127.0.0.1\\@10.0.0.1/"])
async def test_a_redirect_to_another_scheme_or_an_unreadable_url_is_refused(
        sites: Callable[..., Awaitable[Site]], to: str) -> None:
    """Only http: and https: are followed; a URL parsers read differently is not."""
    front = await sites("front")
    with pytest.raises(SsrfRefused):
        await guarded_fetch(front.url(f"/redirect?to={to}", host="front.example"),
                            allow=ALLOW_ONE, resolve=Resolve(front_example="127.0.0.1"))


async def test_redirects_are_followed_and_each_hop_is_checked_again(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """Two allowed hops: each host looked up once, the final answer and the path reported."""
    site = await sites("site")
    resolve = Resolve(a_example="127.0.0.1", b_example="127.0.0.1")
    final = site.url("/done", host="b.example")
    answer = await guarded_fetch(
        site.url(f"/redirect?to=/redirect?to={final}", host="a.example"),
        allow=ALLOW_ONE, resolve=resolve)
    assert (answer.status, answer.text(), answer.url) == (200, "from site", final)
    assert answer.redirects == (site.url(f"/redirect?to={final}", host="a.example"), final)
    assert resolve.calls == Counter({"a.example": 2, "b.example": 1})


async def test_too_many_redirects_is_a_permanent_error(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """A redirect loop stops after max_redirects with HttpLimitExceeded."""
    site = await sites("loop")
    with pytest.raises(HttpLimitExceeded, match="more than 3 times") as caught:
        await guarded_fetch(site.url("/loop"), allow=ALLOW_ONE, max_redirects=3,
                            resolve=Resolve())
    assert isinstance(caught.value, PermanentToolError)
    assert len(site.seen) == 4


async def test_a_303_after_post_goes_on_as_get_and_credentials_stay_home(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """The body is dropped, the method becomes GET, Authorization stays on its origin."""
    site = await sites("site")
    resolve = Resolve(a_example="127.0.0.1", b_example="127.0.0.1")
    other = site.url("/landing", host="b.example")
    async with GuardedHttp(ALLOW_ONE, resolve=resolve) as http:
        answer = await http.post(site.url(f"/redirect?status=303&to={other}", host="a.example"),
                                 json={"x": 1}, headers={"Authorization": "Bearer secret"})
    assert answer.status == 200
    first, second = site.seen
    assert (first["method"], first["body"]) == ("POST", b'{"x": 1}')
    assert first["headers"]["Authorization"] == "Bearer secret"
    assert (second["method"], second["body"]) == ("GET", b"")
    assert "Authorization" not in second["headers"]


# ------------------------------------------------------------------- TLS


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for ``name`` (and its key), written to ``folder``."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_verifies_the_host_name_while_connecting_to_the_checked_address(
        sites: Callable[..., Awaitable[Site]], tmp_path: Path) -> None:
    """SNI and the certificate check use secure.example; the socket goes to 127.0.0.1."""
    cert, key = _certificate(tmp_path, "secure.example")
    names: list[str | None] = []
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    def record_sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        names.append(name)

    server_tls.sni_callback = record_sni  # type: ignore[assignment]
    site = await sites("tls", tls=server_tls)
    client_tls = ssl.create_default_context(cafile=str(cert))
    url = f"https://secure.example:{site.port}/"
    answer = await guarded_fetch(url, allow=ALLOW_ONE, tls=client_tls,
                                 resolve=Resolve(secure_example="127.0.0.1"))
    assert (answer.text(), answer.address, names) == ("from tls", "127.0.0.1", ["secure.example"])
    with pytest.raises(HttpUnreachable, match="did not verify"):
        await guarded_fetch(f"https://wrong.example:{site.port}/", allow=ALLOW_ONE,
                            tls=client_tls, resolve=Resolve(wrong_example="127.0.0.1"))


# ------------------------------------------------------------------- bounds and failures


@pytest.mark.parametrize("path", ["/big", "/stream"])
async def test_a_body_over_the_limit_is_a_permanent_error(
        sites: Callable[..., Awaitable[Site]], path: str) -> None:
    """Declared or streamed, a body past max_body_bytes stops the read."""
    site = await sites("big")
    with pytest.raises(HttpLimitExceeded, match="max_body_bytes"):
        await guarded_fetch(site.url(path), allow=ALLOW_ONE, max_body_bytes=1000,
                            resolve=Resolve())


async def test_a_request_past_its_timeout_is_a_transient_timeout(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """No answer within timeout_s: HttpTimeout, a TimeoutError."""
    site = await sites("held")
    with pytest.raises(HttpTimeout, match=r"did not finish within 0\.2s") as caught:
        await guarded_fetch(site.url("/hold"), allow=ALLOW_ONE, timeout_s=0.2,
                            resolve=Resolve())
    assert isinstance(caught.value, TimeoutError)


async def test_a_refused_connection_is_a_network_failure(free_port: int) -> None:
    """Nothing listening: HttpUnreachable, a ConnectionError."""
    with pytest.raises(HttpUnreachable, match=r"cannot connect to 127\.0\.0\.1") as caught:
        await guarded_fetch(f"http://127.0.0.1:{free_port}/", allow=ALLOW_ONE,
                            resolve=Resolve())
    assert isinstance(caught.value, ConnectionError)


async def test_a_name_that_does_not_resolve_is_unreachable() -> None:
    """A lookup failure is a network failure, not a refusal."""
    with pytest.raises(HttpUnreachable, match="does not resolve"):
        await guarded_fetch("http://nowhere.invalid/", resolve=Resolve())


async def test_an_error_status_maps_to_the_outcome_it_means(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """raise_for_status: 503 transient (with Retry-After), 404 permanent, 200 nothing."""
    site = await sites("status")
    async with GuardedHttp(ALLOW_ONE, resolve=Resolve()) as http:
        (await http.get(site.url("/"))).raise_for_status()
        with pytest.raises(TransientToolError, match="answered 503") as caught:
            (await http.get(site.url("/status?code=503"))).raise_for_status()
        assert caught.value.retry_after_s == 7
        with pytest.raises(PermanentToolError, match="answered 404"):
            (await http.get(site.url("/status?code=404"))).raise_for_status()


async def test_a_closed_client_refuses_new_requests(
        sites: Callable[..., Awaitable[Site]]) -> None:
    """After aclose a request raises RuntimeError instead of opening a new pool."""
    site = await sites("site")
    http = GuardedHttp(ALLOW_ONE, resolve=Resolve())
    await http.get(site.url())
    await http.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await http.get(site.url())


async def test_data_and_json_together_are_a_usage_error() -> None:
    """A body is data or json, never both; nothing is sent."""
    resolve = Resolve()
    async with GuardedHttp(resolve=resolve) as http:
        with pytest.raises(ValueError, match="data or json"):
            await http.post("http://example.com/", data=b"x", json={"x": 1})
    assert resolve.calls == Counter()


class Link(BaseModel):
    link: str


async def test_an_op_using_the_client_gets_blocked_and_transient_outcomes(
        sites: Callable[..., Awaitable[Site]], free_port: int) -> None:
    """Through call_capability: a refused hop is `blocked`, a dead port a network failure."""
    front = await sites("front")

    async def fetch(params: Link) -> str:
        answer = await guarded_fetch(params.link, allow=ALLOW_ONE, resolve=Resolve())
        return answer.text()

    cap = make_registry({"web.get": ()}, {}, {"web.get": fetch},
                        **{"web.get": {"parameters": Link}}).get("web.get")
    ok = await call_capability(cap, Link(link=front.url()))
    assert (ok.kind, ok.value) == ("success", "from front")
    blocked = await call_capability(cap, Link(link=front.url("/redirect?to=http://127.0.0.2/")))
    assert (blocked.kind, blocked.error_type) == ("blocked", "blocked")
    assert "127.0.0.2 is a loopback address" in (blocked.message or "")
    down = await call_capability(cap, Link(link=f"http://127.0.0.1:{free_port}/"))
    assert (down.kind, down.network_failure) == ("transient", True)


# ------------------------------------------------------------------- through the daemon

PACK = '''
from pydantic import BaseModel, Field
from capd.registry import GuardedHttp, op


class Link(BaseModel):
    link: str = Field(description="Where to look.")


@op("web.peek")
async def peek(params: Link) -> str:
    return f"would fetch {params.link}"


@op("web.fetch")
async def fetch(params: Link) -> str:
    async with GuardedHttp(allow=["localhost"]) as http:
        return (await http.get(params.link)).text()
'''

CAPS = '''
[[capability]]
name = "web.peek"
op = "web.peek"
summary = "Look at a link."

[[capability]]
name = "web.fetch"
op = "web.fetch"
summary = "Fetch a link with the guarded client."
'''


class RedirectServer(ThreadedHttp):
    """A real threaded HTTP server on 127.0.0.1 that redirects every request to ``to``."""

    def __init__(self, to: str) -> None:
        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", to)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(Handler)


@pytest.fixture
def web_daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    (short_tmp / "web_pack.py").write_text(PACK)
    (short_tmp / "caps.toml").write_text(CAPS)
    config = short_tmp / "capd.toml"
    config.write_text(textwrap.dedent("""
        plugins = ["web_pack"]
        plugin_paths = ["."]
        declarations = ["caps.toml"]
        entry_points = false
        state_dir = "state"

        [policy]
        before = ["capd:ssrf_guard"]

        [policy.ssrf]
        allow = ["localhost"]
    """))
    daemon = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
    yield daemon
    daemon.kill()


@pytest.mark.slow
def test_the_daemon_refuses_a_link_inside_and_a_redirect_inside(
        web_daemon: DaemonProcess) -> None:
    """`link: str` given http://127.0.0.1:… is error_blocked; so is a hop the op follows."""
    refused = request(web_daemon.socket, "POST", "/call/web.peek",
                      body={"link": "http://127.0.0.1:8080/admin"})
    assert (refused.status, refused.body["status"], refused.body["error_type"]) == (
        403, "error_blocked", "blocked")
    assert refused.body["message"].startswith(
        "parameter 'link': 127.0.0.1 is a loopback address; the SSRF guard refuses")
    with RedirectServer("http://127.0.0.2:9/secret") as server:
        # localhost is allowed by name, in [policy.ssrf] and in the op's client
        hop = request(web_daemon.socket, "POST", "/call/web.fetch",
                      body={"link": f"http://localhost:{server.port}/start"})
    assert (hop.status, hop.body["status"]) == (403, "error_blocked")
    assert "redirected (hop 1) to http://127.0.0.2:9/secret" in hop.body["message"]
