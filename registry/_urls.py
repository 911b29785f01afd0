"""Read the host of an absolute URL the way the strictest parser in the chain would.

The SSRF guard and the guarded HTTP client must judge the host an op's HTTP
library will connect to, not the host one lenient parser sees. So the reading
follows the WHATWG URL standard where parsers disagree, and refuses (raises)
where they disagree beyond repair:

- leading and trailing spaces and controls are dropped, tabs and newlines
  anywhere are removed (``ht\\ttp://`` is ``http://``), the scheme is case-blind;
- for the special schemes (``http``, ``https``, ``ws``, ``wss``, ``ftp``) any
  run of ``/`` and ``\\`` after the colon leads to the host (``http:/x``,
  ``http:\\\\x`` and ``http:///x`` all name host ``x``); any other scheme needs
  ``//`` and a non-empty host (``gopher://``, ``redis://``, ``s3://``...);
- the host is what follows the *last* ``@`` of the authority (so
  ``http://example.com@127.0.0.1/`` names 127.0.0.1), percent-decoded, mapped
  through IDNA (full-width letters and dots included), lower-cased, without its
  trailing dots;
- a host ending in a number is an IPv4 address in any form resolvers accept:
  ``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1`` are all 127.0.0.1;
- ``[...]`` is an IPv6 literal (a zone ``%25eth0`` is dropped);
- a backslash or a control character inside the authority, a percent-encoded
  delimiter in the host, an IPv4 form no parser accepts, a bad port: the URL is
  unreadable, and :func:`read_url` raises :class:`UnreadableUrl`.

``file:`` URLs are read too (with an empty host for ``file:///...``): they name
this host's own files, which the guard refuses whatever their host. A
scheme-relative URL (``//127.0.0.1/admin``, ``//2130706433/``, ``//metadata/v1``) is
read as ``http:`` would be (a client joins it to an ``http`` base; a lone word with
nothing after it, ``//todo``, is taken for a comment), and a URL wrapped in another
scheme (``jar:http://127.0.0.1/x!/``, ``view-source:https://...``) by the URL it
wraps.
Text that is not an absolute URL with a host (``mailto:x@y``, ``urn:...``,
``localhost:8080``, prose) reads as ``None``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Schemes whose host the WHATWG parser finds after any run of slashes.
SPECIAL_SCHEMES = frozenset({"http", "https", "ws", "wss", "ftp"})

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_EDGES = "".join(chr(c) for c in range(0x21))  # C0 controls and space, stripped at both ends
_TABS_AND_NEWLINES = str.maketrans("", "", "\t\n\r")
_AUTHORITY_END = re.compile(r"[/?#\s]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f]")
# Code points no domain may hold (WHATWG "forbidden domain code point"), after decoding.
_FORBIDDEN_IN_HOST = re.compile(r"[\x00-\x20\x7f#%/:<>?@\[\\\]^|]")


class UnreadableUrl(ValueError):
    """The text is shaped like a URL, but its host cannot be read as every parser would."""


@dataclass(frozen=True)
class UrlHost:
    """Where an absolute URL points: its scheme and its host, read as described above.

    ``host`` is canonical: lower-case ASCII (IDNA), no trailing dot, no brackets,
    an IP address in its usual form; ``address`` is set when the host is an IP
    literal in any spelling. ``written`` is the host as the URL spells it (for
    messages); ``port`` is the explicit port, if any.
    """

    url: str
    scheme: str
    host: str
    written: str
    address: Address | None = None
    port: int | None = None

    @property
    def shown(self) -> str:
        """The host for a message: as written, and what it means when that differs."""
        if self.address is not None and self.address.version == 4 and (
                self.written.lower() != self.host):
            return f"{self.written} (that is {self.host})"
        return self.host


def read_url(text: str) -> UrlHost | None:
    """The scheme and host ``text`` points at, or ``None`` when it is not an absolute URL
    with a host (see the module docstring for what counts).

    Raises :class:`UnreadableUrl` (a ``ValueError``) when ``text`` is URL-shaped but its
    host cannot be read unambiguously; the message says why.
    """
    cleaned = text.strip(_EDGES).translate(_TABS_AND_NEWLINES)
    if cleaned[:2] in ("//", "\\\\", "/\\", "\\/") and cleaned[2:3] not in ("/", "\\", ""):
        return _read_scheme_relative(text, cleaned[2:])
    if ":" not in text:  # the common case, a long text without a URL, costs one scan
        return None
    found = _SCHEME.match(cleaned)
    if found is None:
        return None
    scheme = found.group(1).lower()
    rest = cleaned[found.end():]
    if scheme == "file":
        if not rest or rest[0].isspace():
            return None
        authority = _authority(rest[2:]) if rest.startswith("//") else ""
        return UrlHost(url=text, scheme=scheme, host=authority.rpartition("@")[2].lower(),
                       written=authority)
    if scheme in SPECIAL_SCHEMES:
        after = rest.lstrip("/\\")
        if rest[: len(rest) - len(after)] != "//" and (not after or after[0].isspace()):
            return None  # "http: the protocol": prose, not a URL
    elif rest.startswith("//"):
        after = rest[2:]
    else:  # a URL wrapped in another scheme (jar:http://..., view-source:https://...)
        return read_url(rest) if _SCHEME.match(rest) is not None else None
    authority = _host_part(text, after)
    if not authority and scheme not in SPECIAL_SCHEMES:
        return None  # gopher:///x has no host
    return _read_authority(text, scheme, authority)


def _read_scheme_relative(text: str, after: str) -> UrlHost | None:
    """``text``'s host as an ``http`` base would read it (a client joins ``//host/...`` to
    its base), ``after`` being what follows the leading slashes; None when the authority
    does not look like a host at all (``//todo`` in code is no URL: a host here has a dot
    or a port, is bracketed, is a number in any form resolvers take, is ``localhost``, or
    is followed by a path, as in ``//metadata/computeMetadata/v1``)."""
    authority = _host_part(text, after)  # //127.0.0.1\admin is refused, not a comment
    hostport = authority.rpartition("@")[2]
    host = hostport.partition(":")[0].lower()
    path_follows = after[len(authority):len(authority) + 1] in ("/", "?", "#")
    if not hostport or not ("." in hostport or ":" in hostport or hostport.startswith("[")
                            or host == "localhost" or host.isdigit()
                            or host.startswith("0x") or path_follows):
        return None
    return _read_authority(text, "http", authority)


def _host_part(text: str, after_slashes: str) -> str:
    """The authority of ``text`` (``after_slashes`` follows its ``//``); raise
    :class:`UnreadableUrl` when it holds a backslash or a control character."""
    authority = _authority(after_slashes)
    if "\\" in authority or _CONTROLS.search(authority):
        raise UnreadableUrl(f"{text!r} has a backslash or a control character in its host "
                            "part, which URL parsers read differently")
    return authority


def _authority(after_slashes: str) -> str:
    end = _AUTHORITY_END.search(after_slashes)
    return after_slashes if end is None else after_slashes[: end.start()]


def _read_authority(text: str, scheme: str, authority: str) -> UrlHost:
    hostport = authority.rpartition("@")[2]
    address: Address | None
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            raise UnreadableUrl(f"{text!r} opens an IPv6 literal '[' that it never closes")
        written, tail = hostport[: close + 1], hostport[close + 1:]
        if tail and not tail.startswith(":"):
            raise UnreadableUrl(f"{text!r} has {tail!r} after its IPv6 literal")
        try:
            address = ipaddress.IPv6Address(written[1:-1].split("%", 1)[0])
        except ValueError as exc:
            raise UnreadableUrl(f"{text!r}: {written} is not an IPv6 address") from exc
        port = _port(text, tail[1:])
    else:
        written, _, port_text = hostport.partition(":")  # a host holds no colon
        port = _port(text, port_text)
        host = _domain_to_ascii(text, written)
        labels = host.split(".")
        if len(labels) > 1 and labels[-1] == "":
            labels.pop()
        numeric = _ends_in_a_number(labels[-1])
        address = _ipv4(labels) if numeric else None
        if numeric and address is None:
            raise UnreadableUrl(f"{text!r}: {written!r} ends in a number but is not an IPv4 "
                                "address any parser accepts")
        host = host.rstrip(".")
        if not host:  # an empty host, or only dots
            raise UnreadableUrl(f"{text!r} names no host")
    return UrlHost(url=text, scheme=scheme, host=host if address is None else str(address),
                   written=written, address=address, port=port)


def _port(text: str, port_text: str) -> int | None:
    if not port_text:
        return None
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise UnreadableUrl(f"{text!r} has the port {port_text!r}, which is not a port number")
    return int(port_text)


def _domain_to_ascii(text: str, written: str) -> str:
    """Percent-decode, then IDNA-map (NFKC, case folding, full-width dots) and lower-case."""
    try:
        host = unquote_to_bytes(written).decode("utf-8")
        if not host.isascii():
            host = host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise UnreadableUrl(f"{text!r}: the host {written!r} is not a valid international "
                            f"domain name ({exc})") from exc
    host = host.lower()
    if _FORBIDDEN_IN_HOST.search(host):
        raise UnreadableUrl(f"{text!r}: the host {written!r} holds a character no host name "
                            "may hold (an encoded delimiter, a space or a control)")
    return host


def _ipv4_number(part: str) -> int | None:
    """One part of a numeric IPv4 host: decimal, ``0``-prefixed octal or ``0x`` hex."""
    digits, radix = part, 10
    if part[:2] in ("0x", "0X"):
        digits, radix = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        digits, radix = part[1:], 8
    if not all(c in "0123456789abcdef"[:radix] for c in digits.lower()):
        return None
    return int(digits, radix) if digits else 0


def _ends_in_a_number(label: str) -> bool:
    return bool(label) and ((label.isascii() and label.isdigit())
                            or _ipv4_number(label) is not None)


def _ipv4(labels: list[str]) -> ipaddress.IPv4Address | None:
    """The WHATWG IPv4 parser (inet_aton's forms): up to four parts, the last fills the rest."""
    if len(labels) > 4 or "" in labels:
        return None
    values = [n for part in labels if (n := _ipv4_number(part)) is not None]
    if len(values) < len(labels) or any(n > 255 for n in values[:-1]) or (
            values[-1] >= 256 ** (5 - len(values))):
        return None
    value = values[-1] + sum(n * 256 ** (3 - i) for i, n in enumerate(values[:-1]))
    return ipaddress.IPv4Address(value)
