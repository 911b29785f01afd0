"""What each operator command does inside the daemon. Rows in ``_table`` point here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from pydantic import BaseModel, ValidationError

from capd.recovery import JOB_STATES, Job, JobQueue, RecoveryError
from capd.registry import CALL_EVENTS, CallerHost, Capability, UnknownCapability

from .._args import Params
from .._errors import (
    BadRequest,
    ExportConflict,
    Forbidden,
    UnknownProfile,
    validator_exit,
)
from .._table import (
    CallIn,
    CallItem,
    CallManyIn,
    ConsentGrantIn,
    ExportIn,
    GrantIn,
    HostIn,
    JobIn,
    ListIn,
    PreflightIn,
    PurgeIn,
    QueueListIn,
    RecheckIn,
    RecheckToolIn,
    SearchIn,
    SessionIn,
    ShowIn,
    command,
)
from .._views import (
    capsule,
    disabled_reason,
    disabled_view,
    manifest,
    provider_tool,
)
from ._agent_handlers import (
    agent_resolve,
    agent_show,
    agents_list,
    topologies_list,
    topology_expand,
    topology_show,
    topology_validate,
)
from ._authority import actor
from ._consent import ConsentStore
from ._durations import parse_duration
from ._grant import resolve
from ._json import Unencodable, dumps
from ._offer_handlers import OFFER_HANDLERS
from ._problems import problem_body
from ._result import ToolResult
from ._services import Context, Handler, Reply, Services
from ._streams import NDJSON, answer_kinds, wants_stream
from ._token_handlers import TOKEN_HANDLERS

log = structlog.get_logger("capd.handlers")

if TYPE_CHECKING:
    from capd.recovery import CapabilityRecheck, ToolRecheck

HEALTH_JSON = "application/health+json"


def iso(epoch: float) -> str:
    """UTC epoch seconds as ISO-8601, for the health+json draft's ``time`` fields."""
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


async def health(ctx: Context, _: Params) -> Reply:
    """Overall status from cached results: never waits on a probe or a reload."""
    d = ctx.services
    snap = d.registry.snapshot()
    checks: dict[str, list[dict[str, Any]]] = {}
    status = "pass"
    notes: list[str] = []
    grant = ctx.caller.grant
    # what the grant reaches; the operator's detail (declaration errors with files and
    # lines, a failed reload's reason, every caller's jobs) by role, never by reach
    operator = grant.role == "operator"
    disabled = ({n: e for n, e in snap.disabled.items() if grant.allows(e.capability)}
                if grant.restricted else snap.disabled)
    for name, entry in sorted(disabled.items()):
        view = disabled_view(entry, snap)
        probed = [t for t in view["last_probed"].values() if t is not None]
        checks[f"capability:{name}"] = [{
            "componentId": name,
            "componentType": "capability",
            "status": "warn",
            "observedValue": view["missing"],
            "output": disabled_reason(view),
            "time": iso(max(probed)) if probed else None,
        }]
    if disabled:
        status = "warn"
        notes.append(f"{len(disabled)} capability(ies) disabled")
    if snap.errors and operator:
        status = "warn"
        notes.append(f"{len(snap.errors)} declaration error(s)")
        checks["declarations:errors"] = [{
            "componentType": "component", "status": "warn",
            "observedValue": len(snap.errors), "output": "; ".join(str(e) for e in snap.errors),
        }]
    lag = d.loop_lag_s
    lag_status = "fail" if lag > d.stall_threshold_s else "pass"
    checks["event-loop:lag"] = [{
        "componentType": "system", "status": lag_status, "observedValue": round(lag, 6),
        "observedUnit": "s", "time": iso(time.time()),
    }]
    if lag_status == "fail":
        status = "fail"
        notes.append(f"event loop stalled for {lag:.1f}s")
    if d.state != "ready":
        status = "fail"
        notes.append(f"daemon is {d.state}")
    failed = d.reloader.last_failure
    if failed is not None and not operator:  # the reason names files and lines
        notes.append("the last reload failed; the registry before it keeps serving")
        if status == "pass":
            status = "warn"
    elif failed is not None:  # until the next good reload: the old registry is serving
        if status == "pass":
            status = "warn"
        notes.append("the last reload failed; the registry before it keeps serving")
        checks["reload:last"] = [{
            "componentType": "component", "status": "warn", "output": failed.error,
            "time": iso(failed.started_at),
        }]
    queue_status, queue_notes, queue_checks = await _queue_health(d)
    if not operator:  # every caller's jobs: the operator's to read, in capd queue
        queue_checks = {k: v for k, v in queue_checks.items() if k == "queue:writable"}
        queue_notes = [n for n in queue_notes if "cannot write" in n]
    checks.update(queue_checks)
    notes.extend(queue_notes)
    if queue_status == "fail":
        status = "fail"
    elif queue_status == "warn" and status == "pass":
        status = "warn"
    checks["uptime"] = [{"componentType": "system", "status": "pass",
                         "observedValue": round(d.uptime_s, 3), "observedUnit": "s"}]
    body = {
        "status": status,
        "version": d.version,
        "serviceId": "capd",
        "description": "capd capability sidecar",
        "output": "; ".join(notes) or "all capabilities live",
        "checks": checks,
    }
    return Reply(503 if status == "fail" else 200, body, content_type=HEALTH_JSON)


async def _queue_health(d: Services) -> tuple[str, list[str], dict[str, list[dict[str, Any]]]]:
    if d.queue is None:
        return "pass", [], {}
    try:
        stats = await d.queue_stats()
    except RecoveryError as exc:
        return "fail", [f"retry queue unusable: {exc}"], {"queue:usable": [{
            "componentType": "datastore", "status": "fail", "output": str(exc)}]}
    status, notes = "pass", []
    checks: dict[str, list[dict[str, Any]]] = {}
    # A queue that reads but cannot write (a full disk) cannot accept a failed write.
    write_error = d.queue.write_error or (d.sweep.storage_error if d.sweep else None)
    if write_error:
        status = "fail"
        notes.append(f"retry queue cannot write: {write_error}")
        checks["queue:writable"] = [{"componentType": "datastore", "status": "fail",
                                     "output": write_error}]
    status, notes = _disk_health(d.queue, status, notes, checks)
    stuck = stats.by_state["dead"] + stats.by_state["needs_operator"]
    if stuck:
        status = "fail" if status == "fail" else "warn"
        notes.append(f"{stats.by_state['dead']} dead and {stats.by_state['needs_operator']} "
                     "job(s) needing an operator (capd queue list)")
    age = stats.oldest_pending_age_s
    limit = d.loaded.config.health_pending_age_s
    if age is not None and age > limit:
        status = "fail" if status == "fail" else "warn"
        notes.append(f"oldest pending job is {age:.0f}s old (threshold {limit:g}s)")
    jobs_check: dict[str, Any] = {"componentType": "datastore",
                                  "status": "warn" if stuck else "pass",
                                  "observedValue": stats.by_state}
    if stuck:
        jobs_check["output"] = next(n for n in notes if "dead and" in n)
    checks["queue:jobs"] = [jobs_check]
    checks["queue:oldest-pending-age"] = [{
        "componentType": "datastore",
        "status": "warn" if age is not None and age > limit else "pass",
        "observedValue": None if age is None else round(age, 3), "observedUnit": "s"}]
    return status, notes, checks


FULL_BYTES = 1 << 20
"""Free space under which the queue's file system counts as full (``/health`` fail)."""


def _disk_health(queue: JobQueue, status: str, notes: list[str],
                 checks: dict[str, list[dict[str, Any]]]) -> tuple[str, list[str]]:
    """The queue's file system: pass, warn under the reserve (new jobs refused), fail when
    full; the free space as the observed value."""
    try:
        space = queue.space()
    except RecoveryError as exc:
        checks["queue:disk"] = [{"componentType": "datastore", "status": "fail",
                                 "output": str(exc)}]
        return "fail", [*notes, str(exc)]
    if space is None:  # a database's disk is the database's to watch
        return status, notes
    free, reserve = space
    mib = f"{free / 2**20:.1f} MiB free (reserve {reserve / 2**20:.1f} MiB)"
    check: dict[str, Any] = {"componentType": "datastore", "status": "pass",
                             "observedValue": free, "observedUnit": "bytes"}
    if free < FULL_BYTES:
        check.update(status="fail", output=f"the queue's disk is full: {mib}")
        status = "fail"
    elif free < reserve:
        check.update(status="warn", output=f"the queue's disk is nearly full: {mib}; new "
                     "jobs are refused until there is room, queued ones still finish")
        status = "fail" if status == "fail" else "warn"
    if "output" in check:
        notes = [*notes, check["output"]]
    checks["queue:disk"] = [check]
    return status, notes


async def livez(ctx: Context, _: Params) -> Reply:
    """200 while the process serves requests."""
    return Reply(200, {"status": "pass"})


async def readyz(ctx: Context, _: Params) -> Reply:
    """200 when ready, 503 while starting or draining."""
    ready = ctx.services.state == "ready"
    return Reply(200 if ready else 503, {"status": "pass" if ready else "fail",
                                         "state": ctx.services.state})


async def list_caps(ctx: Context, a: ListIn) -> Reply:
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


def _caller_host(a: HostIn) -> CallerHost | None:
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


async def search(ctx: Context, a: SearchIn) -> Reply:
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


async def show(ctx: Context, a: ShowIn) -> Reply:
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


async def export(ctx: Context, a: ExportIn) -> Reply:
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


async def call_many(ctx: Context, a: CallManyIn) -> Reply:
    """Run up to :data:`MAX_CALLS` calls at once, each through the whole call path as this
    caller; answer every one in order, each as it would have been answered alone."""
    gateway = ctx.services.gateway

    async def one(index: int, item: CallItem) -> dict[str, Any]:
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


async def call(ctx: Context, a: CallIn) -> Reply:
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


def _tool_view(outcome: ToolRecheck, shown: Callable[[str], bool]) -> dict[str, Any]:
    return {
        "tool": outcome.tool,
        "ok": outcome.result.ok,
        "error": outcome.result.error,
        "probed": outcome.probed,
        "cooldown_left_s": round(outcome.cooldown_left_s, 3),
        "restored": [n for n in outcome.restored if shown(n)],
        "disabled": [n for n in outcome.disabled if shown(n)],
        "checked_at": outcome.result.checked_at,
    }


def _capability_view(outcome: CapabilityRecheck,
                     shown: Callable[[str], bool]) -> dict[str, Any]:
    return {
        "name": outcome.name,
        "state": "live" if outcome.live else "disabled",
        "missing": list(outcome.missing),
        "restored": [n for n in outcome.restored if shown(n)],
        "tools": [_tool_view(t, shown) for t in outcome.tools],
    }


def _shown(ctx: Context) -> Callable[[str], bool]:
    """Whether a capability named in an answer may be shown to the caller (its grant)."""
    grant, registry = ctx.caller.grant, ctx.services.registry
    if not grant.restricted:
        return lambda _name: True
    return lambda name: grant.reaches(registry, name)


async def recheck(ctx: Context, a: RecheckIn) -> Reply:
    """Re-probe a capability's missing tools (cooldown applies unless forced); an agent
    only one inside its grant (anything else is unknown to it), never forced, and it
    hears only of the capabilities its grant reaches."""
    cap = resolve(ctx.services.registry, a.id, ctx.caller.grant)
    force = a.force
    if force and ctx.caller.grant.role != "operator":
        raise Forbidden("recheck --force (past the probe cooldown) is for operators only; "
                        "without it the last probe within the cooldown answers")
    outcome = await ctx.services.rechecker.recheck_disabled_capability(cap.name, force=force)
    return Reply(200, _capability_view(outcome, _shown(ctx)))


async def recheck_tool(ctx: Context, a: RecheckToolIn) -> Reply:
    """Re-probe one tool and restore every capability it unblocks."""
    outcome = await ctx.services.rechecker.recheck_tool(a.tool, force=a.force)
    return Reply(200, _tool_view(outcome, _shown(ctx)))


async def reload(ctx: Context, _: Params) -> Reply:
    """Run (or join) a full reload and answer when it is done."""
    outcome = await ctx.services.reloader.reload()
    return Reply(200 if outcome.ok else 500, outcome.model_dump(mode="json"))


async def whoami(ctx: Context, _: Params) -> Reply:
    """Who the daemon takes the caller for, and what the bridge may offer it."""
    caller, grant = ctx.caller, ctx.caller.grant
    narrowing = grant.narrowing
    offered = [row_id for row_id in ctx.services.loaded.config.mcp.operator_tools
               if grant.role in command(row_id).roles]
    return Reply(200, {
        "uid": caller.uid, "gid": caller.gid, "pid": caller.pid,
        "groups": sorted(caller.groups) if caller.groups is not None else None,
        "role": grant.role, "bound": grant.bound,
        "profile": grant.profile.name if grant.profile is not None else None,
        "narrowed": (None if narrowing is None else {
            "capabilities": sorted(narrowing.capabilities), "tags": sorted(narrowing.tags),
            "label": narrowing.label}),
        "channel": grant.channel, "session": caller.session,
        "restricted": grant.restricted,
        "mcp": {"operator_tools": offered, "tools": ctx.services.loaded.config.mcp.tools},
    })


async def status(ctx: Context, _: Params) -> Reply:
    """Registry, reload, recheck and call statistics."""
    d = ctx.services
    snap = d.registry.snapshot()
    last = d.reloader.last
    stats = d.rechecker.stats
    body = {
        "state": d.state,
        "version": d.version,
        "pid": d.pid,
        "uptime_s": round(d.uptime_s, 3),
        "socket": str(d.socket_path),
        "registry": {
            **snap.counts,
            "built_at": snap.built_at,
            "tools": {t: (r.model_dump(mode="json")) for t, r in sorted(snap.probes.items())},
            "errors": [e.as_dict() for e in snap.errors],
            "not_on_host": dict(d.registry.not_on_host),
        },
        "reload": {
            "count": d.reloader.count,
            "running": d.reloader.running,
            "last": last.model_dump(mode="json") if isinstance(last, BaseModel) else None,
        },
        "recheck": {"probes": stats.probes, "skipped_cooldown": stats.skipped_cooldown,
                    "shared": stats.shared, "restored": stats.restored,
                    "cooldown_s": d.rechecker.cooldown_s},
        "calls": {"in_flight": d.gateway.in_flight, "by_capability": d.gateway.stats.as_dict()},
        "tasks": d.task_stats(),
        "sweep": ({"outcomes": dict(d.sweep.outcomes), "busy": d.sweep.busy}
                  if d.sweep is not None else None),
        "queue": ((await d.queue.stats()).model_dump(mode="json")
                  if d.queue is not None else None),
        "event_loop_lag_s": round(d.loop_lag_s, 6),
        "mcp": {"operator_tools": list(d.loaded.config.mcp.operator_tools), "http": d.front_door},
        "upstreams": d.upstreams.views(),
        "policy": {"profiles": list(d.policy.profile_names), "recent": list(d.policy.recent)},
    }
    return Reply(200, body)


# ------------------------------------------------------------------------ queue

def _queue(ctx: Context) -> JobQueue:
    if ctx.services.queue is None:
        raise BadRequest("the retry queue is not open")
    return ctx.services.queue


def _job_view(job: Job, ctx: Context | None = None) -> dict[str, Any]:
    """A job as JSON; an unfinished one whose capability is disabled says what it waits
    for (``waiting_for``: the tools down and since when, ``down_since`` epoch seconds)."""
    view = job.model_dump(mode="json")
    registry = ctx.services.registry if ctx is not None else None
    if registry is not None and job.state in ("pending", "leased") \
            and job.capability in registry:  # one a reload took away waits for it (trail)
        entry = registry.disabled_entry(job.capability)
        if entry is not None:
            since = datetime.fromtimestamp(entry.since).astimezone()
            tools = ", ".join(entry.missing) or "its tools"
            view["waiting_for"] = (f"tool {tools} down since {since:%H:%M:%S}"
                                   if since.date() == datetime.now().astimezone().date()
                                   else f"tool {tools} down since {since:%Y-%m-%d %H:%M}")
            view["down_since"] = entry.since
    return view


async def queue_list(ctx: Context, a: QueueListIn) -> Reply:
    """Jobs, newest first, optionally in one state."""
    state = a.state or None
    if state is not None and state not in JOB_STATES:
        raise BadRequest(f"unknown state {state!r}; use one of {', '.join(JOB_STATES)}")
    jobs = await _queue(ctx).list_jobs(state, limit=a.limit)
    return Reply(200, {"jobs": [_job_view(j, ctx) for j in jobs]})


async def queue_show(ctx: Context, a: JobIn) -> Reply:
    """One job with its audit trail."""
    queue = _queue(ctx)
    job = await queue.get(a.id)
    trail = await queue.attempts(job.id)
    # "attempts" is the job's try count; its audit trail is "trail"
    return Reply(200, {**_job_view(job, ctx), "trail": [a.model_dump(mode="json")
                                                        for a in trail]})


async def queue_retry(ctx: Context, a: JobIn) -> Reply:
    """Make a parked or dead job due now (the audit trail says who asked)."""
    job = await _queue(ctx).operator_retry(a.id, actor=actor(ctx.caller))
    return Reply(200, _job_view(job))


async def queue_cancel(ctx: Context, a: JobIn) -> Reply:
    """Cancel a job that is not running (the audit trail says who asked)."""
    return Reply(200, _job_view(await _queue(ctx).cancel(a.id, actor=actor(ctx.caller))))


async def queue_purge(ctx: Context, a: PurgeIn) -> Reply:
    """Delete finished jobs of one state older than a duration."""
    older = parse_duration(a.older_than)
    purged = await _queue(ctx).purge(a.state, older)
    return Reply(200, {"purged": purged, "state": a.state, "older_than_s": older})


async def queue_stats(ctx: Context, _: Params) -> Reply:
    """Counts by state, oldest pending age, next due time, sweep outcomes."""
    queue = _queue(ctx)
    stats = await queue.stats()
    sweep = ctx.services.sweep
    return Reply(200, {**stats.model_dump(mode="json"),
                       "sweep": dict(sweep.outcomes) if sweep else {},
                       "group_commit": {"batches": queue.batches, "jobs": queue.batched_jobs}})


async def metrics(ctx: Context, _: Params) -> Reply:
    """Prometheus text exposition."""
    from ._metrics import CONTENT_TYPE

    return Reply(200, await ctx.services.metrics.render(), content_type=CONTENT_TYPE)



# -- policy: pre-flight, consent, sessions -------------------------------------------------


def _consent_book(ctx: Context) -> ConsentStore:
    book = ctx.services.policy.consent
    if book is None:
        raise BadRequest("consent grants are not open yet (the daemon is starting)")
    return book


async def preflight(ctx: Context, a: PreflightIn) -> Reply:
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


async def consent_grant(ctx: Context, a: ConsentGrantIn) -> Reply:
    """Grant consent for operations (the operator's surface)."""
    operations = [op for item in a.operations for op in item.replace(",", " ").split()]
    if not operations:
        raise BadRequest("name the operations to grant, e.g. vault.write")
    ttl_s = parse_duration(a.ttl)
    if ttl_s <= 0:
        raise BadRequest("the TTL must be positive, e.g. 30m or 1h")
    session = a.session or None
    grant = _consent_book(ctx).grant(operations, ttl_s=ttl_s, session=session,
                                     granted_by_uid=ctx.caller.uid)
    log.info("consent_granted", grant=grant.id, operations=operations, session=session,
             ttl_s=ttl_s, by_uid=ctx.caller.uid)
    return Reply(200, grant.view(time.time()))


async def consent_list(ctx: Context, _: Params) -> Reply:
    """Live consent grants."""
    now = time.time()
    return Reply(200, {"grants": [g.view(now) for g in _consent_book(ctx).live()]})


async def consent_revoke(ctx: Context, a: GrantIn) -> Reply:
    """Revoke one grant."""
    grant = _consent_book(ctx).revoke(a.id)  # UnknownGrant: 404
    log.info("consent_revoked", grant=grant.id, by_uid=ctx.caller.uid)
    return Reply(200, {"revoked": grant.view(time.time())})


async def sessions_list(ctx: Context, _: Params) -> Reply:
    """Sessions loop detection is counting."""
    return Reply(200, {"sessions": ctx.services.policy.loops.sessions()})


async def sessions_reset(ctx: Context, a: SessionIn) -> Reply:
    """Forget one session's loop counts."""
    session = a.session
    known = ctx.services.policy.loops.reset(session)
    log.info("session_reset", session=session, known=known, by_uid=ctx.caller.uid)
    return Reply(200, {"session": session, "reset": known})


HANDLERS: dict[str, Handler] = {
    "agent_resolve": agent_resolve,
    "agent_show": agent_show,
    "agents_list": agents_list,
    "call": call,
    "call_many": call_many,
    **OFFER_HANDLERS,
    **TOKEN_HANDLERS,
    "consent_grant": consent_grant,
    "consent_list": consent_list,
    "consent_revoke": consent_revoke,
    "export": export,
    "health": health,
    "list_caps": list_caps,
    "livez": livez,
    "metrics": metrics,
    "preflight": preflight,
    "queue_cancel": queue_cancel,
    "queue_list": queue_list,
    "queue_purge": queue_purge,
    "queue_retry": queue_retry,
    "queue_show": queue_show,
    "queue_stats": queue_stats,
    "readyz": readyz,
    "recheck": recheck,
    "recheck_tool": recheck_tool,
    "reload": reload,
    "search": search,
    "sessions_list": sessions_list,
    "sessions_reset": sessions_reset,
    "show": show,
    "status": status,
    "topologies_list": topologies_list,
    "topology_expand": topology_expand,
    "topology_show": topology_show,
    "topology_validate": topology_validate,
    "whoami": whoami,
}
"""Every handler by the name an operator-table row gives (a test checks each row has one)."""
