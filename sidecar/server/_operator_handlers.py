"""What the operator's rows do inside the daemon: rechecks and reloads, who a caller is,
the retry queue, consent grants and loop sessions. Rows in ``_table`` point here."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog

from capd.recovery import JOB_STATES, Job, JobQueue

from .. import _table as t
from .._args import Params
from .._errors import BadRequest, Forbidden
from ._authority import actor
from ._consent import ConsentStore
from ._durations import parse_duration
from ._grant import resolve
from ._services import Context, Reply

if TYPE_CHECKING:
    from capd.recovery import CapabilityRecheck, ToolRecheck

log = structlog.get_logger("capd.handlers")


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


async def recheck(ctx: Context, a: t.RecheckIn) -> Reply:
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


async def recheck_tool(ctx: Context, a: t.RecheckToolIn) -> Reply:
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
               if grant.role in t.command(row_id).roles]
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


async def queue_list(ctx: Context, a: t.QueueListIn) -> Reply:
    """Jobs, newest first, optionally in one state."""
    state = a.state or None
    if state is not None and state not in JOB_STATES:
        raise BadRequest(f"unknown state {state!r}; use one of {', '.join(JOB_STATES)}")
    jobs = await _queue(ctx).list_jobs(state, limit=a.limit)
    return Reply(200, {"jobs": [_job_view(j, ctx) for j in jobs]})


async def queue_show(ctx: Context, a: t.JobIn) -> Reply:
    """One job with its audit trail."""
    queue = _queue(ctx)
    job = await queue.get(a.id)
    trail = await queue.attempts(job.id)
    # "attempts" is the job's try count; its audit trail is "trail"
    return Reply(200, {**_job_view(job, ctx), "trail": [a.model_dump(mode="json")
                                                        for a in trail]})


async def queue_retry(ctx: Context, a: t.JobIn) -> Reply:
    """Make a parked or dead job due now (the audit trail says who asked)."""
    job = await _queue(ctx).operator_retry(a.id, actor=actor(ctx.caller))
    return Reply(200, _job_view(job))


async def queue_cancel(ctx: Context, a: t.JobIn) -> Reply:
    """Cancel a job that is not running (the audit trail says who asked)."""
    return Reply(200, _job_view(await _queue(ctx).cancel(a.id, actor=actor(ctx.caller))))


async def queue_purge(ctx: Context, a: t.PurgeIn) -> Reply:
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


def _consent_book(ctx: Context) -> ConsentStore:
    book = ctx.services.policy.consent
    if book is None:
        raise BadRequest("consent grants are not open yet (the daemon is starting)")
    return book


async def consent_grant(ctx: Context, a: t.ConsentGrantIn) -> Reply:
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


async def consent_revoke(ctx: Context, a: t.GrantIn) -> Reply:
    """Revoke one grant."""
    grant = _consent_book(ctx).revoke(a.id)  # UnknownGrant: 404
    log.info("consent_revoked", grant=grant.id, by_uid=ctx.caller.uid)
    return Reply(200, {"revoked": grant.view(time.time())})


async def sessions_list(ctx: Context, _: Params) -> Reply:
    """Sessions loop detection is counting."""
    return Reply(200, {"sessions": ctx.services.policy.loops.sessions()})


async def sessions_reset(ctx: Context, a: t.SessionIn) -> Reply:
    """Forget one session's loop counts."""
    session = a.session
    known = ctx.services.policy.loops.reset(session)
    log.info("session_reset", session=session, known=known, by_uid=ctx.caller.uid)
    return Reply(200, {"session": session, "reset": known})


OPERATOR_HANDLERS = (recheck, recheck_tool, reload, whoami, queue_list, queue_show, queue_retry,
                     queue_cancel, queue_purge, queue_stats, consent_grant, consent_list,
                     consent_revoke, sessions_list, sessions_reset)
