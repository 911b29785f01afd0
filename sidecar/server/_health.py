"""What the daemon says of itself: health (application/health+json), liveness,
readiness, status and metrics. Every figure is read from what is cached: an answer
never waits on a probe or a reload."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from capd.recovery import RecoveryError

from .._args import Params
from .._views import disabled_reason, disabled_view
from ._services import Context, Reply, Services

HEALTH_JSON = "application/health+json"
FULL_BYTES = 1 << 20
"""Free space under which the queue's file system counts as full (``/health`` fail)."""
_RANK = {"pass": 0, "warn": 1, "fail": 2}


def iso(epoch: float) -> str:
    """UTC epoch seconds as ISO-8601, for the health+json draft's ``time`` fields."""
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


class _Report:
    """Checks and notes, and the worst status any of them said."""

    def __init__(self) -> None:
        self.status = "pass"
        self.notes: list[str] = []
        self.checks: dict[str, list[dict[str, Any]]] = {}

    def say(self, status: str, note: str | None = None) -> None:
        """Count a finding (a status no better than what was found before stays)."""
        if _RANK[status] > _RANK[self.status]:
            self.status = status
        if note:
            self.notes.append(note)

    def check(self, key: str, kind: str, status: str, output: str | None = None,
              note: str | None = None, **fields: Any) -> None:
        """Record one check and count it; what it says is the report's note too, unless
        it has a note of its own."""
        self.checks[key] = [{"componentType": kind, "status": status,
                             **({"output": output} if output else {}), **fields}]
        self.say(status, note or output)


async def health(ctx: Context, _: Params) -> Reply:
    """Overall status. What the grant reaches; the operator's detail (declaration errors
    with files and lines, a failed reload's reason, every caller's jobs) by role, never
    by reach."""
    d, grant = ctx.services, ctx.caller.grant
    snap = d.registry.snapshot()
    operator = grant.role == "operator"
    report = _Report()
    disabled = ({n: e for n, e in snap.disabled.items() if grant.allows(e.capability)}
                if grant.restricted else snap.disabled)
    for name, entry in sorted(disabled.items()):
        view = disabled_view(entry, snap)
        probed = [t for t in view["last_probed"].values() if t is not None]
        report.checks[f"capability:{name}"] = [{
            "componentId": name, "componentType": "capability", "status": "warn",
            "observedValue": view["missing"], "output": disabled_reason(view),
            "time": iso(max(probed)) if probed else None}]
    if disabled:
        report.say("warn", f"{len(disabled)} capability(ies) disabled")
    if snap.errors and operator:
        report.check("declarations:errors", "component", "warn",
                     "; ".join(str(e) for e in snap.errors),
                     f"{len(snap.errors)} declaration error(s)", observedValue=len(snap.errors))
    lag = d.loop_lag_s
    stalled = lag > d.stall_threshold_s
    report.checks["event-loop:lag"] = [{
        "componentType": "system", "status": "fail" if stalled else "pass",
        "observedValue": round(lag, 6), "observedUnit": "s", "time": iso(time.time())}]
    if stalled:
        report.say("fail", f"event loop stalled for {lag:.1f}s")
    if d.state != "ready":
        report.say("fail", f"daemon is {d.state}")
    failed = d.reloader.last_failure
    if failed is not None:  # until the next good reload: the old registry is serving
        report.say("warn", "the last reload failed; the registry before it keeps serving")
        if operator:  # the reason names files and lines
            report.checks["reload:last"] = [{"componentType": "component", "status": "warn",
                                             "output": failed.error,
                                             "time": iso(failed.started_at)}]
    queue = await _queue_health(d)
    report.say(queue.status)
    for key, check in queue.checks.items():  # every caller's jobs: the operator's to read
        if operator or key == "queue:writable":
            report.checks[key] = check
    report.notes += [n for n in queue.notes if operator or "cannot write" in n]
    report.checks["uptime"] = [{"componentType": "system", "status": "pass",
                                "observedValue": round(d.uptime_s, 3), "observedUnit": "s"}]
    body = {"status": report.status, "version": d.version, "serviceId": "capd",
            "description": "capd capability sidecar",
            "output": "; ".join(report.notes) or "all capabilities live",
            "checks": report.checks}
    return Reply(503 if report.status == "fail" else 200, body, content_type=HEALTH_JSON)


async def _queue_health(d: Services) -> _Report:
    report = _Report()
    if d.queue is None:
        return report
    try:
        stats = await d.queue_stats()
    except RecoveryError as exc:
        report.check("queue:usable", "datastore", "fail", str(exc),
                     f"retry queue unusable: {exc}")
        return report
    # A queue that reads but cannot write (a full disk) cannot accept a failed write.
    write_error = d.queue.write_error or (d.sweep.storage_error if d.sweep else None)
    if write_error:
        report.check("queue:writable", "datastore", "fail", write_error,
                     f"retry queue cannot write: {write_error}")
    _disk_health(d, report)
    dead, parked = stats.by_state["dead"], stats.by_state["needs_operator"]
    stuck = (f"{dead} dead and {parked} job(s) needing an operator (capd queue list)"
             if dead + parked else None)
    report.check("queue:jobs", "datastore", "warn" if stuck else "pass", stuck,
                 observedValue=stats.by_state)
    age, limit = stats.oldest_pending_age_s, d.loaded.config.health_pending_age_s
    late = age is not None and age > limit
    report.say("warn" if late else "pass",
               f"oldest pending job is {age:.0f}s old (threshold {limit:g}s)" if late else None)
    report.checks["queue:oldest-pending-age"] = [{
        "componentType": "datastore", "status": "warn" if late else "pass",
        "observedValue": None if age is None else round(age, 3), "observedUnit": "s"}]
    return report


def _disk_health(d: Services, report: _Report) -> None:
    """The queue's file system: pass, warn under the reserve (new jobs refused), fail when
    full; the free space as the observed value (a database's disk is its own to watch)."""
    assert d.queue is not None
    try:
        space = d.queue.space()
    except RecoveryError as exc:
        report.check("queue:disk", "datastore", "fail", str(exc))
        return
    if space is None:
        return
    free, reserve = space
    mib = f"{free / 2**20:.1f} MiB free (reserve {reserve / 2**20:.1f} MiB)"
    status, note = (("fail", f"the queue's disk is full: {mib}") if free < FULL_BYTES else
                    ("warn", f"the queue's disk is nearly full: {mib}; new jobs are refused "
                     "until there is room, queued ones still finish") if free < reserve else
                    ("pass", None))
    report.check("queue:disk", "datastore", status, note, observedValue=free,
                 observedUnit="bytes")


async def livez(ctx: Context, _: Params) -> Reply:
    """200 while the process serves requests."""
    return Reply(200, {"status": "pass"})


async def readyz(ctx: Context, _: Params) -> Reply:
    """200 when ready, 503 while starting or draining."""
    ready = ctx.services.state == "ready"
    return Reply(200 if ready else 503, {"status": "pass" if ready else "fail",
                                         "state": ctx.services.state})


async def status(ctx: Context, _: Params) -> Reply:
    """Registry, reload, recheck and call statistics."""
    d = ctx.services
    snap, last, stats = d.registry.snapshot(), d.reloader.last, d.rechecker.stats
    return Reply(200, {
        "state": d.state, "version": d.version, "pid": d.pid,
        "uptime_s": round(d.uptime_s, 3), "socket": str(d.socket_path),
        "registry": {
            **snap.counts, "built_at": snap.built_at,
            "tools": {t: r.model_dump(mode="json") for t, r in sorted(snap.probes.items())},
            "errors": [e.as_dict() for e in snap.errors],
            "not_on_host": dict(d.registry.not_on_host)},
        "reload": {"count": d.reloader.count, "running": d.reloader.running,
                   "last": last.model_dump(mode="json") if last is not None else None},
        "recheck": {"probes": stats.probes, "skipped_cooldown": stats.skipped_cooldown,
                    "shared": stats.shared, "restored": stats.restored,
                    "cooldown_s": d.rechecker.cooldown_s},
        "calls": {"in_flight": d.gateway.in_flight, "by_capability": d.gateway.stats.as_dict()},
        "tasks": d.task_stats(),
        "sweep": ({"outcomes": dict(d.sweep.outcomes), "busy": d.sweep.busy}
                  if d.sweep is not None else None),
        "queue": (await d.queue.stats()).model_dump(mode="json") if d.queue else None,
        "event_loop_lag_s": round(d.loop_lag_s, 6),
        "mcp": {"operator_tools": list(d.loaded.config.mcp.operator_tools), "http": d.front_door},
        "upstreams": d.upstreams.views(),
        "policy": {"profiles": list(d.policy.profile_names), "recent": list(d.policy.recent)},
    })


async def metrics(ctx: Context, _: Params) -> Reply:
    """Prometheus text exposition."""
    from ._metrics import CONTENT_TYPE

    return Reply(200, await ctx.services.metrics.render(), content_type=CONTENT_TYPE)
