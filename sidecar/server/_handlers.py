"""What the rows agents use do inside the daemon: list, search, show and export
capabilities, and call them. The handlers of every row, by name: :data:`HANDLERS`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
from pydantic import ValidationError

from capd.registry import CALL_EVENTS, CallerHost, Capability, UnknownCapability

from .. import _table as t
from .._errors import BadRequest, ExportConflict, UnknownProfile, validator_exit
from .._views import capsule, disabled_view, manifest, provider_tool
from ._agent_handlers import (
    agent_resolve,
    agent_show,
    agents_list,
    topologies_list,
    topology_expand,
    topology_show,
    topology_validate,
)
from ._grant import resolve
from ._health import health, livez, metrics, readyz, status
from ._json import Unencodable, dumps
from ._offer_handlers import OFFER_HANDLERS
from ._operator_handlers import OPERATOR_HANDLERS
from ._problems import problem_body
from ._result import ToolResult
from ._services import Context, Handler, Reply
from ._streams import NDJSON, answer_kinds, wants_stream
from ._token_handlers import TOKEN_HANDLERS


async def list_caps(ctx: Context, a: t.ListIn) -> Reply:
    """Capsules of every capability, optionally filtered by state or tag."""
    snap = ctx.services.registry.snapshot()
    state, tag = a.state, a.tag
    visible, host = _visible(ctx), _caller_host(a)
    left_out: dict[str, str] = {}

    def seen(cap: Capability) -> bool:
        return visible(cap) and _runs_for(cap, host, left_out)

    items = [capsule(c, live=True) for c in snap.live.values() if seen(c)]
    items += [capsule(e.capability, live=False) for e in snap.disabled.values()
              if seen(e.capability)]
    counts = {"live": sum(i["state"] == "live" for i in items),
              "disabled": sum(i["state"] == "disabled" for i in items),
              "errors": snap.counts["errors"]}
    if ctx.services.policy.bound(ctx.caller):  # what is hidden is not counted either
        counts["errors"] = 0
    items = [i for i in items if (state is None or i["state"] == state)
             and (tag is None or tag in i["tags"])]
    items.sort(key=lambda i: i["name"])
    offset, limit = _cursor(a.cursor), a.limit
    page = items[offset:offset + limit]
    more = offset + limit < len(items)
    body: dict[str, Any] = {"capabilities": page, "counts": counts,
                            "next_cursor": str(offset + limit) if more else None}
    if host is not None:
        body["not_for_host"] = dict(sorted(left_out.items()))
    return Reply(200, body)


def _caller_host(a: t.HostIn) -> CallerHost | None:
    """What the caller says its host has; None when it says nothing."""
    if not a.model_fields_set & {"host_os", "host_gui", "host_tokens", "host_scm"}:
        return None
    return CallerHost(os=a.host_os or None, gui=a.host_gui,
                      tokens=frozenset(a.host_tokens or ()),
                      tokens_known=a.host_tokens is not None,
                      scm=None if a.host_scm is None else tuple(a.host_scm))


def _runs_for(cap: Capability, host: CallerHost | None, left_out: dict[str, str]) -> bool:
    """Whether ``cap`` is of use on the caller's host (noting why not in ``left_out``)."""
    if host is None or cap.host_caps is None:
        return True
    why = cap.host_caps.unmet(host)
    if why is None:
        return True
    left_out[cap.name] = why
    return False


def _visible(ctx: Context) -> Callable[[Capability], bool]:
    """Whether the caller's profile lets it see a capability (no profile: everything)."""
    policy = ctx.services.policy
    caller = ctx.caller
    return lambda cap: policy.visible(caller, cap)


def _cursor(cursor: str | None) -> int:
    """A page's offset from the ``next_cursor`` the previous page answered."""
    if not cursor:
        return 0
    if not cursor.isdigit():
        raise BadRequest(f"cursor {cursor!r} is no next_cursor capd answered; leave it out "
                         "for the first page")
    return int(cursor)


MAX_QUERY_BYTES = 1024
MAX_QUERY_WORDS = 64
MAX_QUERY_TAGS = 32
"""The most a search query may hold: its size is the caller's, and ranking costs with it."""

DEFAULT_K = {"inner": 3, "outer": 8}
"""How many results a search answers by default, by the latency class it asks for."""


async def search(ctx: Context, a: t.SearchIn) -> Reply:
    """Hybrid (BM25 + semantic) search over capsules, with a confidence; disabled ones only
    when asked, with why; ``explain=true`` says which terms and neighbours matched."""
    d = ctx.services
    registry = d.registry
    query, tags = a.query, a.tags
    if not query.strip() and not tags:
        raise BadRequest("search needs a query (q=...) or a tag")
    if len(query.encode()) > MAX_QUERY_BYTES or len(query.split()) > MAX_QUERY_WORDS \
            or len(tags) > MAX_QUERY_TAGS:
        raise BadRequest(f"a search query holds at most {MAX_QUERY_WORDS} words and "
                         f"{MAX_QUERY_BYTES} bytes, and at most {MAX_QUERY_TAGS} tags: "
                         "say what the tool should do in a sentence")
    include_disabled, explain, latency, safety = (a.include_disabled, a.explain,
                                                  a.latency_class, a.safety)
    # the tiers' K: a fast inner loop looks at 3, an outer one weighs 8
    k = a.k or DEFAULT_K.get(latency or "", 5)
    live = registry.live_view()
    seen, host = _visible(ctx), _caller_host(a)
    left_out: dict[str, str] = {}

    def allowed(name: str) -> bool:
        if not include_disabled and name not in live:
            return False
        cap = registry.get(name)
        return ((safety is None or cap.safety == safety) and seen(cap)
                and _runs_for(cap, host, left_out))

    # what the caller may see, ranked as if nothing else existed (the search stack, numpy
    # and all, is imported with it)
    index = await d.search.index(ctx.caller.grant)
    ranking = await asyncio.to_thread(  # off the loop: a search costs with its query
        partial(index.rank, query, k=k, tags=tags, latency_class=latency, allowed=allowed,
                boost=d.search.boosts(), explain=explain))
    snap = registry.snapshot() if include_disabled else None
    results = []
    for hit in ranking.hits:
        item: dict[str, Any] = {**capsule(hit.capability, live=hit.capability.name in live),
                                "score": None if hit.exact else round(hit.score, 4),
                                "relevance": 1.0 if hit.exact else _relevance(hit.score),
                                "exact": hit.exact}
        if snap is not None and hit.capability.name in snap.disabled:
            item["disabled"] = disabled_view(snap.disabled[hit.capability.name], snap)
        if hit.explanation is not None:
            item["explain"] = {"terms": list(hit.explanation.terms),
                               "neighbours": list(hit.explanation.neighbours),
                               "lexical": hit.explanation.lexical,
                               "semantic": hit.explanation.semantic}
        results.append(item)
    body: dict[str, Any] = {"query": query, "confidence": ranking.confidence,
                            "results": results}
    if host is not None:  # what the caller's host cannot run, counted apart
        body["not_for_host"] = len(left_out)
    return Reply(200, body)


async def show(ctx: Context, a: t.ShowIn) -> Reply:
    """The full manifest of one capability."""
    registry = ctx.services.registry
    cap = resolve(registry, a.id, ctx.caller.grant)  # hidden: as if unknown
    form = a.format
    if form is not None:
        try:
            return Reply(200, provider_tool(cap, form))
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
    body = manifest(cap, registry.snapshot())
    stats = ctx.services.gateway.stats
    calls = dict(stats.by_status.get(cap.name, {}))
    total = sum(calls.values())
    body["telemetry"] = {
        "calls": calls,
        "success_rate": ((calls.get("success", 0) + calls.get("partial", 0)) / total
                         if total else None),
        "mean_duration_s": stats.total_duration_s.get(cap.name, 0.0) / total if total else None,
    }
    return Reply(200, body)


async def export(ctx: Context, a: t.ExportIn) -> Reply:
    """Every capability's tool definition in one provider's format (a policy profile's
    only, with ``profile``); what cannot be rendered is listed under ``skipped``."""
    form, profile = a.format, a.profile or None
    policy = ctx.services.policy
    grant = ctx.caller.grant
    if profile is not None and grant.restricted:  # another's profile is not its to read
        own = grant.profile.name if grant.profile is not None else None
        if profile != own:
            raise UnknownProfile(profile, [own] if own else [])
    elif profile is not None and profile not in policy.profile_names:
        raise UnknownProfile(profile, list(policy.profile_names))
    snap = ctx.services.registry.snapshot()
    caps = list(snap.live.values())
    if a.include_disabled:
        caps += [entry.capability for entry in snap.disabled.values()]
    seen = _visible(ctx)
    chosen = sorted((c for c in caps if seen(c)
                     and (profile is None or policy.in_profile(profile, c))),
                    key=lambda c: c.name)
    tools: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    owners: dict[str, list[str]] = {}
    for cap in chosen:
        try:
            tool = provider_tool(cap, form)
        except ValueError as exc:  # a name no provider accepts: said, not dropped silently
            skipped.append({"name": cap.name, "reason": str(exc)})
            continue
        tool_name = tool["function"]["name"] if form == "openai" else tool["name"]
        owners.setdefault(tool_name, []).append(cap.name)
        tools.append(tool)
    clashes = {tool: names for tool, names in owners.items() if len(names) > 1}
    if clashes:
        raise ExportConflict(form, clashes)
    return Reply(200, {"format": form, "profile": profile, "count": len(tools),
                       "tools": tools, "skipped": skipped})


_CALL_STATUS = {"success": 200, "partial": 200, "error_transient": 503, "error_permanent": 502,
                "error_blocked": 403}
"""The HTTP status of each result state (202 instead when the call was queued)."""


def _scoped(ctx: Context, key: str | None) -> str | None:
    """An ``Idempotency-Key``, in its caller's name space: an agent's keys (by uid and
    grant) never meet another caller's, so none can claim, or learn of, another's job."""
    tag = ctx.caller.grant.tag
    if key is None or tag is None:
        return key
    if ctx.caller.uid is None:  # a bearer token's: its tag names it
        return f"{tag}:{key}"
    return f"{tag}:{ctx.caller.uid}:{key}"


async def call_many(ctx: Context, a: t.CallManyIn) -> Reply:
    """Run up to :data:`MAX_CALLS` calls at once, each through the whole call path as this
    caller; answer every one in order, each as it would have been answered alone."""
    gateway = ctx.services.gateway

    async def one(index: int, item: t.CallItem) -> dict[str, Any]:
        try:
            result = await gateway.dispatch(
                item.capability, item.params, ctx.caller,
                request_id=f"{ctx.request_id}.{index}",
                idempotency_key=_scoped(ctx, item.idempotency_key), timeout_s=a.timeout_s)
        except Exception as exc:  # each call answers what it would have alone
            status, problem = problem_body(exc, f"/call/{item.capability}")
            return {"http_status": status, "problem": problem}
        reply = _call_reply(result)
        return {"http_status": reply.status, "tool_result": orjson.loads(reply.body)}

    results = await asyncio.gather(*(one(i, c) for i, c in enumerate(a.calls)))
    return Reply(200, {"results": results})


def _relevance(score: float) -> float:
    """A search score as relevance in [0, 1]: the fused score (1 = best on both rankers;
    below 0 when its meaning is further from the query than the catalogue's mean) clipped,
    to two places."""
    return round(min(1.0, max(0.0, score)), 2)


async def call(ctx: Context, a: t.CallIn) -> Reply:
    """Dispatch a call; the HTTP status follows the result's state. Asked for a stream
    (``Accept: application/x-ndjson``), a call that has something to say before it
    answers streams it (``_streams.py``)."""
    dispatch = ctx.services.gateway.dispatch(
        a.id, a.arguments, ctx.caller, request_id=ctx.request_id,
        idempotency_key=_scoped(ctx, a.idempotency_key), timeout_s=a.timeout_s,
        run_disabled=a.run_disabled)
    if not wants_stream(ctx.headers):
        return _call_reply(await dispatch)
    stream = ctx.services.streams.open(ctx.caller, answer_kinds(ctx.headers))
    token = CALL_EVENTS.set(stream)
    try:
        task = asyncio.get_running_loop().create_task(dispatch)
    finally:
        CALL_EVENTS.reset(token)
    try:
        streaming = await stream.said_something(task, ctx.gone() if ctx.gone else None)
    except BaseException:
        stream.close()
        task.cancel()
        raise
    if not streaming:
        stream.close()
        return _call_reply(task.result())
    return Reply(200, None, NDJSON, stream=stream.body(task, _last_line))


def _last_line(result: ToolResult) -> bytes:
    """A streamed call's last line: its ToolResult and the status it would have answered."""
    reply = _call_reply(result)
    return b'{"event":"result","http_status":%d,"tool_result":%s}' % (reply.status, reply.body)


def _call_reply(result: ToolResult) -> Reply:
    """The answer to a call: its ToolResult, with the status its state says."""
    body = result.as_json()
    try:
        encoded = dumps(body)
    except Unencodable as exc:
        # The op ran and its work is done; only its answer cannot travel. Say exactly
        # that, so nobody retries a write that happened.
        body.update(status="error_permanent", result=None, error_type="result_unencodable",
                    message=f"{result.capability} ran (its work is done; do not retry) but its "
                    f"result cannot be written as JSON: {exc}")
        encoded = dumps(body)
    status = _CALL_STATUS[body["status"]]
    if result.queued:
        status = 202
    headers = {}
    if result.retry_after_s is not None and status == 503:
        headers["Retry-After"] = str(max(1, round(result.retry_after_s)))
    return Reply(status, encoded, headers=headers)


async def preflight(ctx: Context, a: t.PreflightIn) -> Reply:
    """Check a plan of calls in one round trip: consent still needed, refusals and why."""
    services = ctx.services
    registry = services.registry
    policy = services.policy
    snap = registry.snapshot()
    needed: list[str] = []
    refused: list[dict[str, Any]] = []
    ready: list[int] = []
    for index, item in enumerate(a.calls):
        name = item.get("capability") if isinstance(item, dict) else None
        params = item.get("params", {}) if isinstance(item, dict) else None
        if not isinstance(name, str) or not isinstance(params, dict):
            refused.append({"index": index, "capability": name, "reason": "malformed",
                            "detail": 'each call is {"capability": NAME, "params": {...}}'})
            continue
        try:
            cap = resolve(registry, name, ctx.caller.grant)  # hidden: as if unknown
        except UnknownCapability as exc:
            refused.append({"index": index, "capability": name, "reason": "unknown",
                            "detail": str(exc)})
            continue
        if not ctx.caller.grant.speaks_for(cap):
            refused.append({"index": index, "capability": cap.name,
                            "reason": "wrong_channel",
                            "detail": f"runs only in channel {', '.join(cap.channels)}"})
            continue
        problems = _params_problems(cap, params)
        if problems:
            refused.append({"index": index, "capability": cap.name,
                            "reason": "invalid_params", "detail": problems})
            continue
        entry = snap.disabled.get(cap.name)
        if entry is not None:
            view = disabled_view(entry, snap)
            refused.append({"index": index, "capability": cap.name, "reason": "disabled",
                            "detail": f"missing {', '.join(view['missing'])}",
                            "missing_tools": view["missing"], "errors": view["errors"]})
            continue
        book = policy.consent
        missing = book.missing(cap.consent_operations, ctx.caller.session) if book else []
        needed.extend(op for op in missing if op not in needed)
        ready.append(index)
    return Reply(200, {"consent_needed": needed, "refused": refused, "ready": ready,
                       "ok": not needed and not refused})


def _params_problems(cap: Capability, params: dict[str, Any]) -> list[dict[str, Any]]:
    unknown = cap.unknown_params(params)
    if unknown:
        return [{"loc": [k], "msg": "unknown parameter", "type": "extra_forbidden"}
                for k in unknown]
    try:
        cap.parameters.model_validate(params)
    except ValidationError as exc:
        return [dict(e) for e in exc.errors(include_url=False, include_context=False,
                                            include_input=False)]
    except (SystemExit, KeyboardInterrupt) as exc:  # a validator of the plugin's exited
        return [validator_exit(exc)]
    return []


HANDLERS: dict[str, Handler] = {
    **{h.__name__: h for h in (list_caps, search, show, export, call, call_many, preflight,
                               health, livez, readyz, status, metrics, agents_list,
                               agent_show, agent_resolve, topologies_list, topology_show,
                               topology_validate, topology_expand, *OPERATOR_HANDLERS)},
    **OFFER_HANDLERS, **TOKEN_HANDLERS}
"""Every handler by the name an operator-table row gives (a test checks each row has one)."""
