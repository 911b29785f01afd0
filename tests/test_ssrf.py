"""The built-in SSRF guard: URL parameters that reach inside are refused."""

from __future__ import annotations

import pytest
from pydantic import AnyUrl, BaseModel, Field, HttpUrl

from capd.registry import Blocked
from capd.sidecar.server import Caller
from capd.sidecar.server._ssrf import SsrfGuard, url_parameters

from .fakes import make_registry


class Fetch(BaseModel):
    url: str = Field(description="What to fetch.")
    note: str = "x"


class Typed(BaseModel):
    target: HttpUrl
    mirror: AnyUrl | None = None
    callback_url: str | None = None
    text: str = "http://127.0.0.1/ in prose is not a URL parameter"


def capability(model: type[BaseModel]):  # type: ignore[no-untyped-def]
    registry = make_registry({"web.fetch": ()}, {}, **{"web.fetch": {"parameters": model}})
    return registry.get("web.fetch")


async def resolve(host: str) -> list[str]:
    table = {"localhost": ["127.0.0.1", "::1"], "example.com": ["93.184.216.34"],
             "sneaky.example": ["93.184.216.34", "10.0.0.7"],
             "internal.corp": ["10.1.2.3"]}
    if host not in table:
        raise OSError(f"Name or service not known: {host}")
    return table[host]


def test_url_typed_and_url_named_parameters_are_found() -> None:
    cap = capability(Typed)
    params = Typed(target="https://a.example/x", mirror="ftp://b.example/",
                   callback_url="http://c.example/")
    names = [name for name, _ in url_parameters(cap, params)]
    assert names == ["target", "mirror", "callback_url"]


@pytest.mark.parametrize(("url", "why"), [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://localhost/", "loopback"),
    ("http://127.0.0.1:8080/admin", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:169.254.169.254]/", "link-local"),
    ("http://10.0.0.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://100.64.0.1/", "not a globally routable"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://sneaky.example/", "private"),
    ("http://nowhere.invalid/", "does not resolve"),
    ("file:///etc/passwd", "names no host"),
])
async def test_inside_addresses_are_refused_with_the_reason(url: str, why: str) -> None:
    guard = SsrfGuard(resolve=resolve)
    with pytest.raises(Blocked, match=why):
        await guard(capability(Fetch), Fetch(url=url), Caller())


async def test_public_hosts_pass() -> None:
    guard = SsrfGuard(resolve=resolve)
    await guard(capability(Fetch), Fetch(url="https://example.com/page"), Caller())
    await guard(capability(Fetch), Fetch(url="http://93.184.216.34/"), Caller())


async def test_an_allowlisted_host_or_network_passes() -> None:
    guard = SsrfGuard(["localhost", "*.corp", "10.0.0.0/8"], resolve=resolve)
    await guard(capability(Fetch), Fetch(url="http://localhost:9000/"), Caller())
    await guard(capability(Fetch), Fetch(url="http://internal.corp/"), Caller())
    await guard(capability(Fetch), Fetch(url="http://10.9.9.9/"), Caller())
    with pytest.raises(Blocked, match="link-local"):
        await guard(capability(Fetch), Fetch(url="http://169.254.169.254/"), Caller())


async def test_the_refusal_names_the_parameter_and_the_fix() -> None:
    guard = SsrfGuard(resolve=resolve)
    with pytest.raises(Blocked) as caught:
        await guard(capability(Fetch), Fetch(url="http://localhost/"), Caller())
    message = caught.value.message
    assert message.startswith("parameter 'url': localhost (it resolves to 127.0.0.1)")
    assert "[policy.ssrf] allow" in message


class Nested(BaseModel):
    target: Fetch


class Many(BaseModel):
    urls: list[AnyUrl]
    mirror_urls: list[str] = []


@pytest.mark.parametrize(("model", "params"), [
    (Many, {"urls": ["https://example.com/", "http://169.254.169.254/latest/"]}),
    (Many, {"urls": ["https://example.com/"], "mirror_urls": ["http://localhost/"]}),
    (Nested, {"target": {"url": "http://169.254.169.254/"}}),
])
async def test_urls_in_lists_and_nested_models_are_checked(model: type[BaseModel],
                                                          params: dict[str, object]) -> None:
    guard = SsrfGuard(resolve=resolve)
    with pytest.raises(Blocked):
        await guard(capability(model), model.model_validate(params), Caller())


@pytest.mark.parametrize("url", [
    "http://127.0.0.1\\@8.8.8.8/",         # parsers disagree on the host: refused outright
    "http://[2002:7f00:1::]/",             # 6to4 carrying 127.0.0.1
    "http://[2002:a9fe:a9fe::]/",          # 6to4 carrying 169.254.169.254
])
async def test_parser_tricks_and_embedded_ipv4_are_refused(url: str) -> None:
    guard = SsrfGuard(resolve=resolve)
    with pytest.raises(Blocked):
        await guard(capability(Fetch), Fetch(url=url), Caller())
