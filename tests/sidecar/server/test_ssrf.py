"""The built-in SSRF guard: every URL the op is given that reaches inside is refused."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

import pytest
from pydantic import AnyUrl, BaseModel, ConfigDict, Field, HttpUrl, PostgresDsn, computed_field

from capd.registry import (
    Blocked,
    NetGuard,
    SsrfRefused,
    UrlHost,
    classify_address,
    read_url,
)
from capd.sidecar.server import Caller
from capd.sidecar.server._ssrf import MAX_DEPTH, SsrfGuard, find_urls
from tests.helpers.fakes import make_registry
from tests.helpers.text import fullwidth

WIDE_LOCALHOST = fullwidth("localhost")
WIDE_LOOPBACK = fullwidth("127.0.0.1")  # the dots too: U+FF0E


class Fetch(BaseModel):
    url: str = Field(description="What to fetch.")
    note: str = "x"


class Link(BaseModel):
    link: str


class Typed(BaseModel):
    target: HttpUrl
    mirror: AnyUrl | None = None
    callback_url: str | None = None
    text: str = "no URL in here"


class Nested(BaseModel):
    target: Fetch


class Many(BaseModel):
    urls: list[AnyUrl]
    mirror_urls: list[str] = []


class Inner(BaseModel):
    homepage: str


@dataclass
class Box:
    where: str


class Choice(Enum):
    LOCAL = "http://10.0.0.3/"


class Everywhere(BaseModel):
    model_config = ConfigDict(extra="allow")

    link: str = "https://example.com/"
    links: list[str] = []
    pairs: tuple[str, ...] = ()
    meta: dict[str, Any] = {}
    inner: Inner | None = None
    box: Box | None = None
    choice: Choice | None = None
    dsn: PostgresDsn | None = None
    host: str = "example.com"
    port: int = 443

    @computed_field  # type: ignore[prop-decorator]
    @property
    def joined(self) -> str:
        return f"https://{self.host}:{self.port}/"


def capability(model: type[BaseModel]):  # type: ignore[no-untyped-def]
    registry = make_registry({"web.fetch": ()}, {}, **{"web.fetch": {"parameters": model}})
    return registry.get("web.fetch")


class Resolve:
    """A resolver at the edge of the world: a fixed table, every question counted."""

    TABLE: ClassVar[dict[str, list[str]]] = {
        "localhost": ["127.0.0.1", "::1"], "example.com": ["93.184.216.34"],
        "example.org": ["2606:2800:220:1::"], "sneaky.example": ["93.184.216.34", "10.0.0.7"],
        "internal.corp": ["10.1.2.3"], "metadata.google.internal": ["169.254.169.254"]}

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def __call__(self, host: str) -> list[str]:
        self.calls[host] += 1
        if host not in self.TABLE:
            raise OSError(f"Name or service not known: {host}")
        return self.TABLE[host]


resolve = Resolve()


async def guard_call(model: type[BaseModel], params: dict[str, Any],
                     guard: SsrfGuard | None = None) -> None:
    guard = guard or SsrfGuard(resolve=resolve)
    await guard(capability(model), model.model_validate(params), Caller())


# ------------------------------------------------------------------- what is looked at


def test_url_typed_and_url_named_parameters_are_found() -> None:
    """Pydantic URL values and strings under url-ish keys are found, as before."""
    params = Typed(target="https://a.example/x", mirror="ftp://b.example/",
                   callback_url="http://c.example/")
    names = [name for name, _ in find_urls(params)]
    assert names == ["target", "mirror", "callback_url"]


def test_every_url_string_is_found_under_any_key_at_any_depth() -> None:
    """Lists, tuples, dicts (keys too), nested models, extras, dataclasses, computed fields."""
    params = Everywhere.model_validate({
        "link": "http://a.example/", "links": ["plain words", "http://b.example/"],
        "pairs": ["gopher://c.example/"], "meta": {"http://d.example/": {"deep": ["wss://e.example"]}},
        "inner": {"homepage": "https://f.example/"}, "box": Box("ftp://g.example/"),
        "dsn": "postgres://u@h1.example:5432,h2.example/db", "extra_field": "redis://i.example/",
    })
    found = {where: target.host for where, target in find_urls(params)}
    assert found == {
        "link": "a.example", "links[1]": "b.example", "pairs[0]": "c.example",
        "meta (a key)": "d.example", "meta.http://d.example/.deep[0]": "e.example",
        "inner.homepage": "f.example", "box.where": "g.example", "dsn": "h2.example",
        "extra_field": "i.example", "joined": "example.com",
    }


@pytest.mark.parametrize("text", [
    "just words", "localhost:8080", "10.0.0.1", "mailto:root@127.0.0.1", "urn:isbn:0451450523",
    "http: the protocol", "see http://127.0.0.1/ for details", "C:\\Windows", "gopher:///x",
])
def test_text_that_is_not_an_absolute_url_with_a_host_is_not_a_url(text: str) -> None:
    """Prose, bare hosts and host-less URIs are left alone (prose holding a URL too)."""
    assert read_url(text) is None


@pytest.mark.parametrize(("text", "host", "address"), [
    ("http://2130706433/", "127.0.0.1", "127.0.0.1"),
    ("http://0x7f.1/", "127.0.0.1", "127.0.0.1"),
    ("http://0x7f000001/", "127.0.0.1", "127.0.0.1"),
    ("http://0177.0.0.1/", "127.0.0.1", "127.0.0.1"),
    ("http://017700000001/", "127.0.0.1", "127.0.0.1"),
    ("http://127.1/", "127.0.0.1", "127.0.0.1"),
    ("http://127.0.0.1./", "127.0.0.1", "127.0.0.1"),
    ("http://[::1]:8080/", "::1", "::1"),
    ("http://[0:0:0:0:0:0:0:1]/", "::1", "::1"),
    ("http://[fe80::1%25eth0]/", "fe80::1", "fe80::1"),
    ("http://example.com@127.0.0.1/", "127.0.0.1", "127.0.0.1"),
    ("http://user:pw@example.com:80@10.0.0.1/", "10.0.0.1", "10.0.0.1"),
    ("HTTP://LOCALHOST./", "localhost", None),
    ("http://localhost.../", "localhost", None),
    ("http://%6c%6f%63%61%6c%68%6f%73%74/", "localhost", None),
    (f"http://{WIDE_LOCALHOST}/", "localhost", None),
    (f"http://{WIDE_LOOPBACK}/", "127.0.0.1", "127.0.0.1"),
    ("http://bücher.example/", "xn--bcher-kva.example", None),
    ("http:/127.0.0.1/", "127.0.0.1", "127.0.0.1"),
    ("http:\\\\127.0.0.1/", "127.0.0.1", "127.0.0.1"),
    ("https:///127.0.0.1/", "127.0.0.1", "127.0.0.1"),
    ("  h\tttp://127.0.0.1/\n", "127.0.0.1", "127.0.0.1"),
    ("http://127.0.0.1 is the admin page", "127.0.0.1", "127.0.0.1"),
    ("gopher://127.0.0.1:70/_stats", "127.0.0.1", "127.0.0.1"),
    ("redis://10.0.0.1:6379/0", "10.0.0.1", "10.0.0.1"),
])
def test_hosts_are_read_as_the_strictest_parser_reads_them(text: str, host: str,
                                                           address: str | None) -> None:
    """Numeric IPv4 forms, IPv6, userinfo, trailing dots, IDNA, odd slashes: one reading."""
    target = read_url(text)
    assert target is not None
    assert target.host == host
    assert (str(target.address) if target.address else None) == address


@pytest.mark.parametrize("text", [
    "http://127.0.0.1\\@8.8.8.8/", "http://1.2.3.4.5/", "http://08.0.0.1/", "http://256.1.1.1.1/",
    "http://[::1/", "http://[not-v6]/", "http://exa%2fmple.com/", "http://a.example:99999/",
    "http://", "http://:80/", "http://ex\x01ample.com/",
])
def test_a_url_no_two_parsers_read_alike_is_unreadable(text: str) -> None:
    """What cannot be read unambiguously raises, so the guard can refuse it."""
    with pytest.raises(ValueError, match=r"\S"):
        read_url(text)


# ------------------------------------------------------------------- what is refused


@pytest.mark.parametrize(("url", "why"), [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://metadata.google.internal/", "link-local"),
    ("http://localhost/", "loopback"),
    ("http://127.0.0.1:8080/admin", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:169.254.169.254]/", "link-local"),
    ("http://[64:ff9b::a9fe:a9fe]/", "it carries 169.254.169.254 \\(NAT64\\)"),
    ("http://[64:ff9b:1::1]/", "local-use NAT64"),
    ("http://[fec0::1]/", "site-local"),
    ("http://[ff02::1]/", "multicast"),
    ("http://10.0.0.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://240.0.0.1/", "reserved"),
    ("http://sneaky.example/", "10.0.0.7, one of 2 addresses"),
    ("http://nowhere.invalid/", "does not resolve"),
    ("file:///etc/passwd", "file: URL"),
    ("FILE://server/share", "file: URL"),
])
async def test_inside_addresses_are_refused_with_the_reason(url: str, why: str) -> None:
    """Each kind of inside address is refused, and the message says which kind."""
    with pytest.raises(Blocked, match=why):
        await guard_call(Fetch, {"url": url})


@pytest.mark.parametrize("url", [
    "http://2130706433/", "http://0x7f.1/", "http://0x7f000001/", "http://0177.0.0.1/",
    "http://017700000001/", "http://127.1/", "http://[::1]/", "http://[0:0:0:0:0:0:0:1]/",
    "http://[::ffff:127.0.0.1]/", "http://example.com@127.0.0.1/", "HTTP://LOCALHOST./",
    "http://127.0.0.1./", f"http://{WIDE_LOCALHOST}/", "http://%31%32%37.0.0.1/",
    "http:/127.0.0.1/", "http:\\\\127.0.0.1\\x", "gopher://127.0.0.1:70/_x",
    "ftp://127.0.0.1/", "wss://[::1]/socket", "dict://localhost:11211/stats",
    "http://127.0.0.1:8080/x", "http://127.0.0.1\\@8.8.8.8/", "http://[2002:7f00:1::]/",
    "http://[2002:a9fe:a9fe::]/",
])
async def test_every_spelling_of_an_inside_address_under_a_plain_key_is_refused(url: str) -> None:
    """A `link: str` parameter gets each trick; every one is refused."""
    with pytest.raises(SsrfRefused, match=r"^parameter 'link': "):
        await guard_call(Link, {"link": url})


@pytest.mark.parametrize(("model", "params", "where"), [
    (Many, {"urls": ["https://example.com/", "http://169.254.169.254/latest/"]}, "urls[1]"),
    (Many, {"urls": ["https://example.com/"], "mirror_urls": ["http://localhost/"]},
     "mirror_urls[0]"),
    (Nested, {"target": {"url": "http://169.254.169.254/"}}, "target.url"),
    (Everywhere, {"links": ["nothing", "http://127.0.0.1:8080/x"]}, "links[1]"),
    (Everywhere, {"pairs": ["http://[::1]/"]}, "pairs[0]"),
    (Everywhere, {"meta": {"home": {"then": "http://10.0.0.1/"}}}, "meta.home.then"),
    (Everywhere, {"meta": {"http://0x7f.1/": 1}}, "meta (a key)"),
    (Everywhere, {"inner": {"homepage": "http://localhost/"}}, "inner.homepage"),
    (Everywhere, {"comment": "http://127.0.0.1:8080/x"}, "comment"),
    (Everywhere, {"box": Box("http://192.168.0.1/")}, "box.where"),
    (Everywhere, {"choice": "http://10.0.0.3/"}, "choice"),
    (Everywhere, {"dsn": "postgres://u@example.com,10.0.0.9:5432/db"}, "dsn"),
    (Everywhere, {"host": "127.0.0.1", "port": 6379}, "joined"),
    (Fetch, {"url": "https://example.com/", "note": "http://127.0.0.1:8080/x"}, "note"),
])
async def test_urls_anywhere_in_the_parameters_are_checked(
        model: type[BaseModel], params: dict[str, object], where: str) -> None:
    """Lists, nested models, dicts and their keys, extras, free text: the place is named."""
    with pytest.raises(SsrfRefused, match="^" + re.escape(f"parameter {where!r}: ")):
        await guard_call(model, params)


async def test_parameters_nested_too_deep_to_walk_are_refused() -> None:
    """What the guard cannot walk it refuses, rather than let through unseen."""
    deep: Any = "http://example.com/"
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(Blocked, match="nested deeper than"):
        await guard_call(Everywhere, {"meta": {"x": deep}})


# ------------------------------------------------------------------- what passes


async def test_public_hosts_pass() -> None:
    """Public names and addresses, in any place, are let through."""
    await guard_call(Fetch, {"url": "https://example.com/page"})
    await guard_call(Fetch, {"url": "http://93.184.216.34/"})
    await guard_call(Link, {"link": "https://example.org/"})
    await guard_call(Everywhere, {"links": ["https://EXAMPLE.com./x"], "comment": "plain",
                                  "meta": {"https://example.com/": "a key"},
                                  "box": Box("http://[2606:4700::1]/")})


async def test_values_that_are_not_urls_are_not_resolved() -> None:
    """Prose, bare hosts and numbers cost no DNS lookup and pass."""
    counting = Resolve()
    guard = SsrfGuard(resolve=counting)
    await guard_call(Everywhere, {"link": "localhost:8080", "comment": "see http://x for more",
                                  "links": ["10.0.0.1", "mailto:root@localhost"]}, guard)
    assert counting.calls == Counter({"example.com": 1})  # the computed `joined` only


async def test_each_distinct_host_is_resolved_once_per_call() -> None:
    """Fifty URLs on one host cost one lookup."""
    counting = Resolve()
    links = [f"https://example.com/{i}" for i in range(50)]
    await guard_call(Everywhere, {"links": links}, SsrfGuard(resolve=counting))
    assert counting.calls == Counter({"example.com": 1})


async def test_an_allowlisted_host_or_network_passes() -> None:
    """[policy.ssrf] allow: names, globs and networks, checked as before."""
    guard = SsrfGuard(["localhost", "*.corp", "10.0.0.0/8"], resolve=resolve)
    await guard_call(Fetch, {"url": "http://localhost:9000/"}, guard)
    await guard_call(Fetch, {"url": "http://internal.corp/"}, guard)
    await guard_call(Fetch, {"url": "http://10.9.9.9/"}, guard)
    await guard_call(Link, {"link": "http://0x0a.1/"}, guard)  # 10.0.0.1, numerically
    with pytest.raises(Blocked, match="link-local"):
        await guard_call(Fetch, {"url": "http://169.254.169.254/"}, guard)


async def test_an_allowlisted_name_is_not_resolved() -> None:
    """A host allowed by name passes even where DNS does not answer for it."""
    counting = Resolve()
    guard = SsrfGuard(["allowed.example"], resolve=counting)
    await guard_call(Link, {"link": "http://allowed.example/page"}, guard)
    assert counting.calls == Counter()


# ------------------------------------------------------------------- how it says so


async def test_the_refusal_names_the_parameter_and_the_fix() -> None:
    """Which parameter, which host and address, why, and how to allow it."""
    with pytest.raises(Blocked) as caught:
        await guard_call(Fetch, {"url": "http://localhost/"})
    message = caught.value.message
    assert message.startswith("parameter 'url': localhost (it resolves to 127.0.0.1, one of 2 "
                              "addresses) is a loopback address")
    assert "[policy.ssrf] allow" in message
    assert isinstance(caught.value, SsrfRefused)
    assert (caught.value.host, caught.value.address) == ("localhost", "127.0.0.1")


async def test_a_numeric_spelling_is_shown_with_the_address_it_means() -> None:
    """`0x7f.1` is shown as written and as the address it is."""
    with pytest.raises(SsrfRefused) as caught:
        await guard_call(Everywhere, {"links": ["http://0x7f.1/"]})
    assert caught.value.message == (
        "parameter 'links[0]': 0x7f.1 (that is 127.0.0.1) is a loopback address; the SSRF "
        "guard refuses URLs that reach inside. If this host is meant to be reachable, add it "
        "to [policy.ssrf] allow in capd.toml.")


async def test_an_unreadable_url_is_refused_with_what_is_wrong() -> None:
    """A backslash in the host part is refused outright, naming the parameter."""
    with pytest.raises(SsrfRefused, match=r"^parameter 'link': .*backslash"):
        await guard_call(Link, {"link": "http://127.0.0.1\\@8.8.8.8/"})


async def test_the_first_refused_value_in_order_is_reported() -> None:
    """With several refused values, the one reported is the first in field order."""
    with pytest.raises(SsrfRefused, match=r"^parameter 'link': "):
        await guard_call(Everywhere, {"link": "http://10.0.0.1/",
                                      "links": ["http://127.0.0.1/"]})


# ------------------------------------------------------------------- the classification


@pytest.mark.parametrize(("address", "kind"), [
    ("0.0.0.0", "the unspecified address"),
    ("127.0.0.53", "a loopback address"),
    ("169.254.169.254", "a link-local address (where cloud metadata services answer)"),
    ("100.100.100.200", "a carrier-grade NAT address"),
    ("172.16.0.1", "a private address"),
    ("fd00::1", "a private address"),
    ("224.0.0.1", "a multicast address"),
    ("::ffff:10.0.0.1", "a private address: it carries 10.0.0.1 (IPv4-mapped)"),
    ("64:ff9b::7f00:1", "a loopback address: it carries 127.0.0.1 (NAT64)"),
    ("2002:c0a8:101::", "a private address: it carries 192.168.1.1 (6to4)"),
    ("8.8.8.8", None),
    ("64:ff9b::808:808", None),
    ("2606:4700::1111", None),
])
def test_addresses_are_classified_with_what_they_are(address: str, kind: str | None) -> None:
    """classify_address names the kind, judging IPv4 carried in IPv6 as itself."""
    assert classify_address(ipaddress.ip_address(address)) == kind


async def test_netguard_returns_the_addresses_it_judged() -> None:
    """NetGuard.check hands back what it resolved, so a client can connect to exactly that."""
    guard = NetGuard(resolve=resolve)
    target = read_url("https://example.com/x")
    assert isinstance(target, UrlHost)
    assert await guard.check(target) == (ipaddress.ip_address("93.184.216.34"),)
