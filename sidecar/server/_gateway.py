"""Dispatch: validate, apply the policy, recheck if disabled, call under a timeout, classify.

Every call ends as a :class:`ToolResult` in one of five states. The gateway
raises only for requests that never reach a capability: an unknown name
(:class:`registry.UnknownCapability`), invalid parameters, unknown ones
included (:class:`InvalidParams`), or a daemon that is draining
(:class:`Draining`).

``dispatch`` reads as: resolve the name under the caller's grant (outside it,
a capability is as unknown as one never declared) → validate → the chain of
steps (``_steps.py``: authorize → channel → consent → loops → before-hooks →
error routing → invoke) → failure sink (the retry queue) → record (after-hooks,
counters, the call log). The chain is composed once per capability, grant and
policy, and cached in the gateway. Hooks may be coroutines or plain functions; a plain
one runs on the hook executor, never on the event loop. Each runs under
``hook_timeout_s``; a before-hook that raises or overruns blocks the call (fail
closed) and says so.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import shlex
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from capd.recovery import (
    CallOutcome,
    Rechecker,
    apply_passive_health,
    call_capability,
    tracing,
)
from capd.registry import (
    Capability,
    Registry,
    ThreadHandle,
    ToolAnswer,
    UnknownCapability,
)

from .._errors import Draining, InvalidParams, InvalidTimeout, validator_exit
from .._logging import log_call
from ._grant import Caller, Grant, resolve
from ._policy import NamedHook, Policy
from ._result import STATUS_OF, ToolResult, ToolResultStatus
from ._steps import PLAIN, STEPS, Call, CallOptions, Link, Next, Outcome, Step, compose

__all__ = [
    "RUN_DISABLED_OPERATION",
    "BeforeHook",
    "CallStats",
    "Caller",
    "FailureSink",
    "Gateway",
    "ToolResult",
    "ToolResultStatus",
]

_GENERIC_TAGS = frozenset({"mcp"})
"""Tags that say where a capability comes from, not what it does."""

RUN_DISABLED_OPERATION = "capd.run_disabled"
"""The consent operation that lets a caller run a disabled capability that mutates state."""

def _observer_copy(result: ToolResult) -> ToolResult:
    """A copy of ``result`` an after-hook may do anything to: every mutable part is its
    own (a deep copy only where a value is itself mutable)."""
    return ToolResult.assemble({key: copy.deepcopy(value) if isinstance(value, dict | list)
                                else value for key, value in result.__dict__.items()})


BeforeHook = Callable[[Capability, BaseModel, Caller], Awaitable[None] | None]


class FailureSink(Protocol):
    """Where a transient failure of a mutating call goes (the durable retry queue).

    ``running`` is the call's thread when it was still running as the call gave
    up on it: the queue must not retry the job while it runs.
    """

    async def accept(
        self, capability: Capability, params: BaseModel, result: ToolResult,
        *, idempotency_key: str | None = None, running: ThreadHandle | None = None,
    ) -> ToolResult: ...


@dataclass
class CallStats:
    """Per-capability call counters since start."""

    by_status: defaultdict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter))
    total_duration_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def record(self, result: ToolResult) -> None:
        """Count ``result``."""
        self.by_status[result.capability][result.status] += 1
        self.total_duration_s[result.capability] += result.duration_s

    def as_dict(self) -> dict[str, Any]:
        """A JSON view."""
        return {
            name: {"calls": dict(counts), "total_duration_s": self.total_duration_s[name]}
            for name, counts in sorted(self.by_status.items())
        }


def _traced(step: Step) -> Link:
    """``step`` inside a ``policy {kind}`` span (tracing on)."""
    name, attributes = f"policy {step.kind}", {"capd.policy.step": step.kind}

    async def traced(call: Call, rest: Next) -> Outcome:
        with tracing.span(name, attributes) as current:
            outcome = await step(call, rest)
            if outcome[0].status == "error_blocked" and outcome[0].error_type:
                current.set_attribute("capd.policy.refused", outcome[0].error_type)
            return outcome

    return traced


class Gateway:
    """Dispatches calls to the current registry's capabilities."""

    def __init__(
        self,
        registry: Callable[[], Registry],
        rechecker: Rechecker,
        *,
        before_hooks: Sequence[BeforeHook] = (),
        policy: Callable[[], Policy] | None = None,
        failure_sink: FailureSink | None = None,
        clock: Callable[[], float] = time.perf_counter,
        executor: Executor | None = None,
        hook_executor: Executor | None = None,
        hook_timeout_s: float = 5.0,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self._registry = registry
        self._rechecker = rechecker
        if policy is None:  # hooks given directly (tests, embedders): a policy of just those
            fixed = Policy(before=[NamedHook(getattr(h, "__qualname__", repr(h)), h)
                                   for h in before_hooks],
                           hook_timeout_s=hook_timeout_s, hook_executor=hook_executor)

            def policy() -> Policy:
                return fixed

        self._policy: Callable[[], Policy] = policy
        self._failure_sink = failure_sink
        self._clock = clock
        self._executor = executor
        self.in_flight = 0
        # Set when the last call in flight ends; made only while someone waits for it
        # (the drain), so a call does not pay for an event nobody watches.
        self._idle: asyncio.Event | None = None
        self.draining = False
        self.stats = CallStats()
        self._observe: Callable[[str, float], None] = observe or (lambda _name, _duration: None)
        self._ids = itertools.count(1)
        self._id_prefix = "g" + os.urandom(3).hex()
        # (capability name, id of the grant) -> (the capability, policy and grant it was
        # made for, the chain)
        self._chains: dict[tuple[str, int], tuple[Capability, Policy, Grant, Next]] = {}
        self._observers: set[asyncio.Task[None]] = set()  # after-hooks of cancelled calls
        if tracing.TRACER is not None:  # on at the start or never: no test per call when off
            self.dispatch = self._traced_dispatch  # type: ignore[method-assign]

    async def wait_idle(self) -> None:
        """Return when no call is in flight."""
        if self.in_flight == 0:
            return
        if self._idle is None:
            self._idle = asyncio.Event()
        await self._idle.wait()

    @property
    def policy(self) -> Policy:
        """The policy calls start on now."""
        return self._policy()

    async def dispatch(
        self,
        name: str,
        params: Mapping[str, Any],
        caller: Caller | None = None,
        *,
        request_id: str | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
        run_disabled: bool = False,
    ) -> ToolResult:
        """Call capability ``name`` with ``params`` and classify the outcome.

        A transient failure of a mutating capability goes to the failure sink
        (the retry queue), keyed by ``idempotency_key`` when given.
        ``timeout_s`` shortens the capability's own ``timeout_s`` for this call.
        ``run_disabled`` runs a capability that is still disabled after a recheck
        (a mutating one only under a grant of ``capd.run_disabled``).

        Raises :class:`UnknownCapability`, :class:`InvalidParams`,
        :class:`InvalidTimeout` (not in ``(0, cap.timeout_s]``) or
        :class:`Draining`; every other failure is a :class:`ToolResult`.
        """
        if self.draining:
            raise Draining("capd is shutting down; retry against the next instance")
        request_id = request_id or f"{self._id_prefix}-{next(self._ids):x}"
        caller = caller or Caller()
        registry = self._registry()  # this call finishes on the snapshot it started with
        policy = self._policy()  # ... and on the policy it started with
        try:
            cap = resolve(registry, name, caller.grant)
        except UnknownCapability:
            if caller.grant.restricted and name in registry:  # hidden: logged, counted
                policy.note("grant", "block", capability=registry.resolve(name), caller=caller,
                            reason=f"outside the caller's grant ({caller.grant.describe()})",
                            request_id=request_id)
            raise
        model = self.validate(cap, params)
        # NaN fails both comparisons, so it is refused too.
        if timeout_s is not None and not 0 < timeout_s <= cap.timeout_s:
            raise InvalidTimeout(cap.name, f"{timeout_s:g}", cap.timeout_s)
        options = (CallOptions(timeout_s, run_disabled)
                   if timeout_s is not None or run_disabled else PLAIN)
        self.in_flight += 1
        call = Call(cap, model, params, caller, request_id, self._clock(), registry, policy,
                    options)
        try:
            chain = self._chain(cap, caller.grant, policy)
            result, running = await chain(call)
        except asyncio.CancelledError:
            # The caller left (a closed stream, an MCP client's cancellation): the call is
            # counted and logged as cancelled, nothing is queued, and the cancel goes on.
            self._record(cap, caller, policy, model, self._finish(
                call, "error_transient", error_type="cancelled",
                message=f"{cap.name} was cancelled by its caller before it answered; its "
                "server was asked to stop it"), request_id)
            raise
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()
                self._idle = None
        if (
            result.status == "error_transient"
            and cap.mutates_state
            and self._failure_sink is not None
        ):
            result = await self._queue(self._failure_sink, cap, model, result,
                                       idempotency_key, running)
        await self._after(cap, caller, policy, model, result)
        self._record(cap, caller, policy, model, result, request_id)
        return result

    async def _traced_dispatch(self, name: str, params: Mapping[str, Any],
                               caller: Caller | None = None, **options: Any) -> ToolResult:
        """:meth:`dispatch` inside an ``execute_tool`` span (tracing on)."""
        registry = self._registry()
        cap = registry.get(name) if name in registry else None
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        if cap is not None:
            attributes["gen_ai.tool.type"] = ("extension" if cap.upstream_tool is not None
                                              else "function")
        with tracing.span(f"execute_tool {name}", attributes) as current:
            try:
                result = await Gateway.dispatch(self, name, params, caller, **options)
            except asyncio.CancelledError:
                tracing.set_error(current, "cancelled", "the caller left before the answer")
                raise
            except Exception as exc:
                tracing.set_error(current, getattr(exc, "error_type", type(exc).__name__),
                                  str(exc))
                raise
            current.set_attribute("gen_ai.tool.call.id", result.request_id)
            current.set_attribute("capd.status", result.status)
            if result.queued:
                current.set_attribute("capd.job.id", result.queued)
            if result.status not in ("success", "partial"):
                tracing.set_error(current, result.error_type or result.status, result.message)
            return result

    async def _queue(self, sink: FailureSink, cap: Capability, model: Any,
                     result: ToolResult, idempotency_key: str | None,
                     running: ThreadHandle | None) -> ToolResult:
        """``result`` handed to the failure sink (the queue), in a span when tracing."""
        with tracing.optional_span("queue.enqueue", {"gen_ai.tool.name": cap.name}) as current:
            queued = await sink.accept(cap, model, result, idempotency_key=idempotency_key,
                                       running=running)
            if current is not None and queued.queued:
                current.set_attribute("capd.job.id", queued.queued)
            elif current is not None:
                tracing.set_error(current, queued.error_type or "not_queued", queued.message)
            return queued

    async def _after(self, cap: Capability, caller: Caller, policy: Policy, model: Any,
                     result: ToolResult) -> None:
        if policy.after:
            # Observers see every outcome (refusals and queued writes included), each its
            # own deep copy: whatever a hook does to it, the caller's answer is unchanged.
            for hook in policy.after_hooks(cap.name):
                await policy.run_after(hook, cap, model, caller, _observer_copy(result))

    def _record(self, cap: Capability, caller: Caller, policy: Policy, model: Any,
                result: ToolResult, request_id: str) -> None:
        """Count, time and log one outcome (and, for a cancelled call, let the after-hooks
        see it in a task of their own: the caller's task is being cancelled)."""
        if result.error_type == "cancelled" and policy.after:
            task = asyncio.get_running_loop().create_task(
                self._after(cap, caller, policy, model, result))
            self._observers.add(task)
            task.add_done_callback(self._observers.discard)
        self.stats.record(result)
        self._observe(cap.name, result.duration_s)
        log_call({
            "capability": cap.name, "status": result.status, "error_type": result.error_type,
            "duration_s": round(result.duration_s, 6), "caller_pid": caller.pid,
            "caller_uid": caller.uid, "request_id": request_id, "queued": result.queued,
        })

    async def run(self, call: Call) -> Outcome:
        """``call`` through its capability's chain for the caller's grant."""
        return await self._chain(call.capability, call.caller.grant, call.policy)(call)

    def _chain(self, cap: Capability, grant: Grant, policy: Policy) -> Next:
        """The composed chain of ``cap`` for callers with ``grant`` under ``policy``: built
        once per capability object, grant and policy, then looked up."""
        # Keyed by the grant's identity (the authority hands out one object per peer and
        # narrowing); the entry holds the grant, so its id cannot be reused meanwhile.
        key = (cap.name, id(grant))
        found = self._chains.get(key)
        if found is not None and found[0] is cap and found[1] is policy and found[2] is grant:
            return found[3]
        steps = [step for make in STEPS if (step := make(self)).applies(cap, grant, policy)]
        chain = compose([_traced(step) for step in steps] if tracing.TRACER is not None
                        else steps, self._invoke)
        if len(self._chains) >= 4096:  # bounded: grants come and go with narrowings
            self._chains.clear()
        self._chains[key] = (cap, policy, grant, chain)
        return chain

    def clock(self) -> float:
        """The gateway's clock (call durations, what is left of a caller's timeout)."""
        return self._clock()

    @staticmethod
    def validate(cap: Capability, params: Mapping[str, Any]) -> BaseModel:
        """``params`` as ``cap``'s model; raise :class:`InvalidParams` naming every problem
        (an unknown parameter among them)."""
        unknown = cap.unknown_params(params)
        if unknown:
            raise InvalidParams(cap.name, [
                {"type": "extra_forbidden", "loc": [key], "msg": (
                    f"unknown parameter {key!r}; the parameters are "
                    f"{', '.join(sorted(cap.parameters.model_fields)) or '(none)'}")}
                for key in unknown])
        try:
            return cap.parameters.model_validate(params)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False, include_input=False)
            raise InvalidParams(cap.name, [dict(e) for e in errors]) from exc
        except (SystemExit, KeyboardInterrupt) as exc:  # a validator of the plugin's exited
            raise InvalidParams(cap.name, [validator_exit(exc)]) from exc

    def refuse(self, call: Call, kind: str, error_type: str, message: str,
               **fields: Any) -> ToolResult:
        """``error_blocked`` for ``call``, logged and counted as a ``kind`` decision."""
        call.policy.note(kind, "block", capability=call.capability.name, caller=call.caller,
                         reason=message, request_id=call.request_id)
        return self._finish(call, "error_blocked", error_type=error_type, message=message,
                            alternatives=[], **fields)

    def _finish(self, call: Call, status: ToolResultStatus, **fields: Any) -> ToolResult:
        registry, cap, grant = call.registry, call.capability, call.caller.grant
        if status in ("success", "partial"):
            fields.setdefault("alternatives", [])
        elif "alternatives" not in fields:
            # a caller hears of nothing outside its grant
            live, why = self._alternatives(registry, cap, fields.get("error_type"),
                                           grant.allows)
            fields["alternatives"] = live
            if why:
                fields["unavailable_alternatives"] = why
        # Every field is built here from known types: skip re-validation. The dict is
        # made in field order (answers list their keys in it); ``fields`` fills it in.
        values: dict[str, Any] = {
            "status": status, "capability": cap.name, "result": None, "error_type": None,
            "message": None, "alternatives": None, "duration_s": self._clock() - call.started,
            "request_id": call.request_id, "retry_after_s": None, "queued": None,
            "warnings": [], "missing_consent": None, "unavailable_alternatives": {},
            "answered_by": None, "content": None, "structured_content": None,
        }
        values.update(fields)
        return ToolResult.assemble(values)

    async def _invoke(self, call: Call) -> Outcome:
        """The last link: recheck a disabled capability, call the op, classify the outcome.

        Returns the result, and the op's thread when it still runs after the call gave up.
        """
        registry, cap, options = call.registry, call.capability, call.options
        warnings: list[str] = []
        if registry.disabled_entry(cap.name) is not None:
            recheck = await self._rechecker.recheck_disabled_capability(cap.name)
            if not recheck.live:
                entry = registry.disabled_entry(cap.name)
                detail = "; ".join(f"{t}: {e}" for t, e in (entry.errors if entry else {}).items())
                missing = ", ".join(recheck.missing)
                if not options.run_disabled:
                    return self._finish(
                        call, "error_transient", error_type="capability_disabled",
                        message=f"{cap.name} is disabled: missing {missing}"
                        + (f" ({detail})" if detail else ""),
                    ), None
                refusal = self._refuse_run_disabled(call)
                if refusal is not None:
                    return refusal, None
                call.policy.note("run_disabled", "annotate", capability=cap.name,
                                 caller=call.caller, reason=f"missing {missing}",
                                 request_id=call.request_id)
                warnings.append(f"{cap.name} ran while disabled (missing {missing}), "
                                "as the caller asked")
        if tracing.TRACER is not None and cap.upstream_tool is not None:
            outcome = await self._traced_upstream(call)
        else:
            outcome = await call_capability(cap, call.params, executor=self._executor,
                                            timeout_s=options.timeout_s)
        apply_passive_health(registry, cap, outcome)
        value, relayed = outcome.value, {}
        if isinstance(value, ToolAnswer):  # an upstream's blocks, beside its value
            relayed = {"content": list(value.content), "structured_content": value.structured}
            value = value.value
        # a success carries no error_type, message (but a partial's) or retry_after_s
        return self._finish(call, STATUS_OF[outcome.kind],
                            result=value if outcome.kind in ("success", "partial") else None,
                            error_type=outcome.error_type, message=outcome.message,
                            retry_after_s=outcome.retry_after_s, warnings=warnings,
                            **relayed), outcome.abandoned

    async def _traced_upstream(self, call: Call) -> CallOutcome:
        """The upstream MCP request of ``call`` inside a ``tools/call`` span."""
        cap = call.capability
        # an upstream tool's op id is mcp:<server id>:<the server's own tool name>
        _, server, tool = (cap.op_id or f"mcp:{cap.requires[0]}:{cap.name}").split(":", 2)
        with tracing.span(f"tools/call {tool}", {
                "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool, "capd.mcp.server": server,
                "capd.capability": cap.name}) as current:
            outcome = await call_capability(cap, call.params, executor=self._executor,
                                            timeout_s=call.options.timeout_s)
            if outcome.kind not in ("success", "partial"):
                tracing.set_error(current, outcome.error_type or outcome.kind, outcome.message)
            return outcome

    def _refuse_run_disabled(self, call: Call) -> ToolResult | None:
        """The refusal of running disabled ``call.capability``, or None when it may run.

        A read may always run anyway; a write only under a live grant of
        ``capd.run_disabled`` (none when consent is not configured).
        """
        cap, caller, policy = call.capability, call.caller, call.policy
        if not cap.mutates_state:
            return None
        wanted = (RUN_DISABLED_OPERATION,)
        missing = (list(wanted) if policy.consent is None
                   else policy.consent.missing(wanted, caller.session))
        if not missing:
            return None
        where = f" --session {shlex.quote(caller.session)}" if caller.session else ""
        return self.refuse(call, "consent", "consent_required", (
            f"{cap.name} is disabled and mutates state; running it anyway needs consent for "
            f"{RUN_DISABLED_OPERATION}. Ask the user; an operator grants it with: capd consent "
            f"grant {RUN_DISABLED_OPERATION}{where} --ttl 10m"), missing_consent=missing)

    @staticmethod
    def _alternatives(registry: Registry, cap: Capability, error_type: str | None,
                      allowed: Callable[[Capability], bool]) -> tuple[list[str], dict[str, str]]:
        """What to try instead, only among what ``allowed`` takes in: the declared chain for
        this error (live ones, and the disabled ones with why), else up to three live
        capabilities sharing a tag that says what they do (never a write for a read)."""
        chain = cap.fallbacks_for(error_type or "")
        if chain:
            live: list[str] = []
            why: dict[str, str] = {}
            for name in chain:
                if not allowed(registry.get(name)):
                    continue
                entry = registry.disabled_entry(name)
                if entry is None:
                    live.append(name)
                else:
                    missing = ", ".join(entry.missing) or "its tools"
                    why[name] = f"disabled: missing {missing}"
            return live, why
        # A tag every upstream tool carries ("mcp"), or the id of the server it needs, says
        # nothing of what a capability does: only the other tags make an alternative.
        tags = set(cap.tags) - _GENERIC_TAGS - set(cap.requires)
        if not tags:
            return [], {}
        view = registry.live_view()
        return sorted(
            n for n, c in view.items()
            if n != cap.name and not tags.isdisjoint(c.tags) and allowed(c)
            # a read is never offered a write in its place
            and (cap.mutates_state or not c.mutates_state))[:3], {}
