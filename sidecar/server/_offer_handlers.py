"""Handlers for what upstream MCP servers offer beside tools, and for streamed calls' answers.

Resources and prompts are served under the server's prefix (``capd://<prefix>/<uri>``,
``<prefix>.<name>``) and under the caller's grant: an offer is inside a grant when a
capability of that server with that name would be (the same globs and tags; the
server's tags are its tools' tags). Outside it, an offer is unknown, as a hidden
capability is. A resource read by a uri no listing names (one made from a template) is
inside the grant when the most specific template of that server that makes the uri is:
templates are matched as RFC 6570 templates (``{name}`` is one segment, ``{+path}`` any
text), most literal text first, so a hidden ``memo://notes/private/{name}`` keeps
``memo://notes/private/payroll`` hidden whatever broader template is allowed.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from capd.registry import (
    ToolUnavailable,
    UnknownOffer,
    Upstream,
    contents_as_json,
)

from .._args import Params
from .._errors import BadRequest, UpstreamFailed
from .._table import AnswerIn, PromptGetIn, ResourceReadIn
from ._grant import Grant
from ._services import Context, Handler, Reply


class Offer(NamedTuple):
    """A server's resource, template or prompt as a grant sees it."""

    name: str
    aliases: tuple[str, ...]
    tags: tuple[str, ...]


def _inside(grant: Grant, upstream: Upstream, name: str) -> bool:
    if not grant.restricted:
        return True
    return grant.allows(Offer(name, (), (*upstream.spec.tags, "mcp", upstream.tool_id)))


async def _listed(ctx: Context, kind: str) -> list[dict[str, Any]]:
    grant = ctx.caller.grant
    return [item for _prefix, upstream, item in await ctx.services.upstreams.offered(kind)
            if _inside(grant, upstream, str(item.get("name", "")))]


async def resources(ctx: Context, _: Params) -> Reply:
    """Every upstream's resources and resource templates inside the caller's grant."""
    return Reply(200, {"resources": await _listed(ctx, "resources"),
                       "templates": await _listed(ctx, "templates")})


async def prompts(ctx: Context, _: Params) -> Reply:
    """Every upstream's prompts inside the caller's grant."""
    return Reply(200, {"prompts": await _listed(ctx, "prompts")})


def _hidden(what: str) -> UnknownOffer:
    return UnknownOffer(f"unknown {what}; list what you may use with GET /resources and "
                        "GET /prompts")


async def resource_read(ctx: Context, a: ResourceReadIn) -> Reply:
    """Read one resource (``{"uri": "capd://<prefix>/<uri>"}``)."""
    uri = a.uri
    if len(uri) > MAX_URI_CHARS:
        raise BadRequest(f"a resource uri holds at most {MAX_URI_CHARS} characters; name "
                         "the resource as listed")
    grant = ctx.caller.grant
    upstream, own = _server(ctx, ctx.services.upstreams.resource_server, f"resource {uri!r}",
                            uri)
    if _dotted(own):
        raise BadRequest(f"{uri!r}: a resource uri with '.' or '..' segments (or their "
                         "percent-encoding) is refused; name the resource as listed")
    if grant.restricted and not await asyncio.to_thread(  # off the loop: a regex per template
            _may_read, grant, upstream, uri,
            await ctx.services.upstreams.offered("resources"),
            await ctx.services.upstreams.offered("templates")):
        raise _hidden(f"resource {uri!r}")
    result = await _asked(upstream, "resources/read", own, upstream.read_resource(own))
    prefix = uri.removeprefix("capd://").partition("/")[0]
    return Reply(200, contents_as_json(prefix, result))


def _server(ctx: Context, lookup: Callable[[str], tuple[Upstream, str]], what: str,
            name: str) -> tuple[Upstream, str]:
    """The server offering ``name`` and its own name for it: a server the caller cannot
    see and none at all are the same answer to a restricted caller."""
    try:
        return lookup(name)
    except UnknownOffer:
        if ctx.caller.grant.restricted:
            raise _hidden(what) from None
        raise


def _dotted(uri: str) -> bool:
    """Whether ``uri``'s path has ``.`` or ``..`` segments, plainly or percent-encoded."""
    path = uri.split("://", 1)[-1].lower().replace("%2e", ".").replace("%2f", "/")
    return any(segment in (".", "..") for segment in path.split("/"))


def _may_read(grant: Grant, upstream: Upstream, uri: str,
              listed: list[tuple[str, Upstream, dict[str, Any]]],
              templates: list[tuple[str, Upstream, dict[str, Any]]]) -> bool:
    for _prefix, owner, item in listed:
        if owner is upstream and item.get("uri") == uri:
            return _inside(grant, upstream, str(item.get("name", "")))
    made = [(_specificity(template), item) for _prefix, owner, item in templates
            if owner is upstream and (template := str(item.get("uriTemplate", "")))
            and _template_pattern(template).fullmatch(uri)]
    if not made:
        return False
    _, most_specific = max(made, key=lambda found: found[0])
    return _inside(grant, upstream, str(most_specific.get("name", "")))


MAX_URI_CHARS = 1024
"""The longest resource uri read (matching one against templates costs with its length)."""

_EXPRESSION = re.compile(r"\{([+#./;?&]?)([^}]*)\}")
_VALUE = {  # what each RFC 6570 operator's expansion may hold; {X}: the characters it
    # must stop at (the first of the literal text after it), so that there is one way to
    # split a uri: matching is linear, never a backtracking blow-up
    "": "[^/?#{X}]*",  # simple: reserved characters are percent-encoded, so one segment
    "+": "[^{X}]*", "#": "(?:#[^{X}]*)?",
    "/": "(?:/[^/?#{X}]*)*", ".": "(?:\\.[^/?#.{X}]*)*", ";": "(?:;[^/?#;{X}]*)*",
    "?": "(?:\\?[^#{X}]*)?", "&": "(?:&[^#{X}]*)?",
}


@functools.lru_cache(maxsize=1024)
def _template_pattern(template: str) -> re.Pattern[str]:
    """The regular expression of the uris ``template`` makes (RFC 6570, levels 1-4).

    Each expression stops at the first character of the literal text that follows it and
    is atomic (it never gives back what it took): one way to split, linear time. A value
    holding that character (``{a}-{b}`` with ``a`` = ``x-y``) is then not matched, and a
    uri no template makes is hidden from a restricted caller: this fails closed.
    """
    pieces: list[str] = []  # literal, operator, literal, operator, ..., literal
    end = 0
    for expression in _EXPRESSION.finditer(template):
        pieces += [template[end:expression.start()], expression.group(1)]
        end = expression.end()
    pieces.append(template[end:])
    parts: list[str] = []
    for index, piece in enumerate(pieces):
        if index % 2 == 0:
            parts.append(re.escape(piece))
            continue
        after = pieces[index + 1]
        stop = re.escape(after[0]) if after else ""
        value = _VALUE[piece] if stop else _VALUE[piece].replace("[^{X}]", ".")
        parts.append("(?>" + value.replace("{X}", stop) + ")")
    return re.compile("".join(parts), re.DOTALL)


def _specificity(template: str) -> tuple[int, int]:
    """How specific ``template`` is: its literal characters, then fewer expressions."""
    expressions = _EXPRESSION.findall(template)
    literal = len(_EXPRESSION.sub("", template))
    return literal, -len(expressions)


async def prompt_get(ctx: Context, a: PromptGetIn) -> Reply:
    """Get one prompt with its arguments (a JSON object of strings)."""
    name, arguments = a.prompt, a.arguments
    upstream, own = _server(ctx, ctx.services.upstreams.prompt_server, f"prompt {name!r}", name)
    if not _inside(ctx.caller.grant, upstream, name):
        raise _hidden(f"prompt {name!r}")
    result = await _asked(upstream, "prompts/get", own, upstream.get_prompt(own, arguments))
    data: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return Reply(200, data)


async def _asked(upstream: Upstream, method: str, what: str, answer: Awaitable[Any]) -> Any:
    """The server's answer to ``method`` of ``what``; its refusal or silence an
    :class:`UpstreamFailed` saying which (a lost server stays ``ToolUnavailable``)."""
    try:
        return await answer
    except (ToolUnavailable, UnknownOffer):
        raise
    except TimeoutError:
        raise UpstreamFailed(f"{upstream.tool_id} did not answer {method} of {what!r} "
                             f"within {upstream.spec.call_timeout_s:g}s") from None
    except Exception as exc:
        raise UpstreamFailed(f"{upstream.tool_id} refused {method} of {what!r}: "
                             f"{_said(exc)}") from exc


def _said(exc: Exception) -> str:
    error = getattr(exc, "error", None)
    message = getattr(error, "message", None)
    return str(message) if message else f"{type(exc).__name__}: {exc}"


async def call_answer(ctx: Context, a: AnswerIn) -> Reply:
    """Answer a question a server asked during a streamed call (see ``_streams.py``)."""
    stream = ctx.services.streams.of(a.call, ctx.caller)
    if stream is None:
        raise UnknownOffer(f"no streamed call {a.call!r} of yours is running; "
                           "a question is answered while its call streams")
    try:
        stream.answer(a.question, a.answer)
    except KeyError:
        raise UnknownOffer(f"call {a.call} asks no question {a.question!r} "
                           "now (answered already, or never asked)") from None
    except TypeError as exc:
        raise BadRequest(str(exc)) from exc
    return Reply(200, {"answered": a.question})


OFFER_HANDLERS: dict[str, Handler] = {
    "resources": resources,
    "resource_read": resource_read,
    "prompts": prompts,
    "prompt_get": prompt_get,
    "call_answer": call_answer,
}
