"""Dispatch: validate, apply the policy, recheck if disabled, call under a timeout, classify.

Every call ends as a :class:`ToolResult` in one of five states. The gateway
raises only for requests that never reach a capability: an unknown name
(:class:`registry.UnknownCapability`), invalid parameters, unknown ones
included (:class:`InvalidParams`), or a daemon that is draining
(:class:`Draining`).

The policy pipeline (``_policy.py``) wraps the call: profile → consent → loop
detector → before-hooks → call → error router → after-hooks. Hooks may be
coroutines or plain functions; a plain one runs on the hook executor, never on
the event loop. Each runs under ``hook_timeout_s``; a before-hook that raises
or overruns blocks the call (fail closed) and says so.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import shlex
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capd.recovery import Rechecker, apply_passive_health, call_capability
from capd.registry import (
    Capability,
    Registry,
    ThreadHandle,
    UnknownCapability,
    model_assembler,
)

from .._errors import Draining, InvalidParams, InvalidTimeout
from .._logging import log_call
from ._policy import NamedHook, Policy
from ._services import Caller

RUN_DISABLED_OPERATION = "capd.run_disabled"
"""The consent operation that lets a caller run a disabled capability that mutates state."""

ToolResultStatus = Literal[
    "success", "partial", "error_transient", "error_permanent", "error_blocked"
]


_STATUS: dict[str, ToolResultStatus] = {
    "transient": "error_transient", "permanent": "error_permanent", "blocked": "error_blocked",
}


class ToolResult(BaseModel):
    """The outcome of one call."""

    model_config = ConfigDict(frozen=True)

    status: ToolResultStatus
    capability: str
    result: Any = None
    error_type: str | None = None
    message: str | None = None
    alternatives: list[str] = Field(default_factory=list)
    duration_s: float
    request_id: str
    retry_after_s: float | None = None
    queued: str | None = None
    warnings: list[str] = Field(default_factory=list)
    missing_consent: list[str] | None = None
    unavailable_alternatives: dict[str, str] = Field(default_factory=dict)
    answered_by: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The result as a JSON-ready mapping (cheaper than model_dump on the hot path)."""
        return dict(self.__dict__)

    @classmethod
    def assemble(cls, values: dict[str, Any]) -> ToolResult:
        """A result from ``values``: every field, in field order, each already of its type.

        What ``model_construct`` does without its per-field loop (a seventh of a
        no-op call's cost); ``values`` becomes the instance's ``__dict__``.
        """
        if len(values) != len(_RESULT_FIELDS):
            raise TypeError(f"a ToolResult needs exactly {', '.join(_RESULT_FIELDS)}; "
                            f"got {', '.join(values)}")
        return _assemble_result(values)

    @property
    def ok(self) -> bool:
        """Whether the call did its work, fully or in part."""
        return self.status in ("success", "partial")


_RESULT_FIELDS = tuple(ToolResult.model_fields)
_assemble_result = model_assembler(ToolResult, {
    **dict.fromkeys(_RESULT_FIELDS), "status": "success", "capability": "a.b", "alternatives": [],
    "duration_s": 0.0, "request_id": "r", "warnings": [], "unavailable_alternatives": {}})


def _observer_copy(result: ToolResult) -> ToolResult:
    """A copy of ``result`` an after-hook may do anything to: every mutable part is its
    own (a deep copy only where the op's value is itself mutable)."""
    clone = copy.copy(result)  # a new __dict__, the same values
    fields = clone.__dict__
    value = fields["result"]
    if isinstance(value, dict | list):
        fields["result"] = copy.deepcopy(value)
    fields["alternatives"] = list(fields["alternatives"])
    fields["warnings"] = list(fields["warnings"])
    fields["unavailable_alternatives"] = dict(fields["unavailable_alternatives"])
    if fields["missing_consent"] is not None:
        fields["missing_consent"] = list(fields["missing_consent"])
    return clone


@dataclass(frozen=True, slots=True)
class _CallOptions:
    """What a caller asked of this one call: a shorter timeout, running while disabled."""

    timeout_s: float | None = None
    run_disabled: bool = False


_PLAIN = _CallOptions()


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

    by_status: dict[str, Counter[str]] = field(default_factory=dict)
    total_duration_s: dict[str, float] = field(default_factory=dict)

    def record(self, result: ToolResult) -> None:
        """Count ``result``."""
        counts = self.by_status.get(result.capability)
        if counts is None:
            counts = self.by_status[result.capability] = Counter()
        counts[result.status] += 1
        self.total_duration_s[result.capability] = (
            self.total_duration_s.get(result.capability, 0.0) + result.duration_s
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON view."""
        return {
            name: {"calls": dict(counts), "total_duration_s": self.total_duration_s[name]}
            for name, counts in sorted(self.by_status.items())
        }


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
            cap = registry.get(name)
        except UnknownCapability as exc:
            if policy.bindings and policy.bound(caller):  # never suggest what is hidden
                raise UnknownCapability(name, [
                    s for s in exc.suggestions if policy.visible(caller, registry.get(s))
                ]) from exc
            raise
        model = self._validate(cap, params)
        # NaN fails both comparisons, so it is refused too.
        if timeout_s is not None and not 0 < timeout_s <= cap.timeout_s:
            raise InvalidTimeout(cap.name, f"{timeout_s:g}", cap.timeout_s)
        options = (_CallOptions(timeout_s, run_disabled)
                   if timeout_s is not None or run_disabled else _PLAIN)
        self.in_flight += 1
        started = self._clock()
        running: ThreadHandle | None = None
        try:
            if policy.applies(cap, caller):
                result, running = await self._guarded(registry, policy, cap, model, params,
                                                      caller, request_id, started,
                                                      options=options)
            else:
                result, running = await self._call(registry, policy, cap, model, caller,
                                                   request_id, started, options)
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
            result = await self._failure_sink.accept(cap, model, result,
                                                    idempotency_key=idempotency_key,
                                                    running=running)
        if policy.after:
            # Observers see every outcome (refusals and queued writes included), each its
            # own deep copy: whatever a hook does to it, the caller's answer is unchanged.
            for hook in policy.after_hooks(cap.name):
                await policy.run_after(hook, cap, model, caller, _observer_copy(result))
        self.stats.record(result)
        self._observe(cap.name, result.duration_s)
        log_call({
            "capability": cap.name, "status": result.status, "error_type": result.error_type,
            "duration_s": round(result.duration_s, 6), "caller_pid": caller.pid,
            "caller_uid": caller.uid, "request_id": request_id, "queued": result.queued,
        })
        return result

    @staticmethod
    def _validate(cap: Capability, params: Mapping[str, Any]) -> BaseModel:
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

    def _refuse(self, registry: Registry, policy: Policy, cap: Capability, caller: Caller,
                request_id: str, started: float, kind: str, error_type: str, message: str,
                **fields: Any) -> ToolResult:
        policy.note(kind, "block", capability=cap.name, caller=caller, reason=message,
                    request_id=request_id)
        return self._finish(registry, cap, request_id, started, "error_blocked",
                            error_type=error_type, message=message, alternatives=[], **fields)

    async def _guarded(
        self, registry: Registry, policy: Policy, cap: Capability, params: BaseModel,
        raw: Mapping[str, Any], caller: Caller, request_id: str, started: float,
        *, fallback: bool = False, options: _CallOptions | None = None,
    ) -> tuple[ToolResult, ThreadHandle | None]:
        """The call inside the policy pipeline (profile, consent, loops ... after-hooks).

        ``raw`` is the parameters as the caller sent them (JSON), which loop detection
        compares (the model holds the same values, validated).
        """
        def refuse(kind: str, error_type: str, message: str, **fields: Any) -> ToolResult:
            return self._refuse(registry, policy, cap, caller, request_id, started, kind,
                                error_type, message, **fields)

        if policy.bindings:
            profile = policy.profile_for(caller)
            if profile is not None and not profile.allows(cap):
                return refuse("profile", "outside_profile", (
                    f"{cap.name} is outside profile {profile.name!r}, which binds this "
                    f"caller (uid {caller.uid}); ask the operator to widen the profile")), None
            policy.allow("profile")
        if cap.consent_operations and policy.consent is not None:
            missing = policy.consent.missing(cap.consent_operations, caller.session)
            if missing:
                where = f" --session {shlex.quote(caller.session)}" if caller.session else ""
                return refuse("consent", "consent_required", (
                    f"{cap.name} needs consent for {', '.join(missing)}; no live grant covers "
                    f"it. Ask the user; an operator grants it with: capd consent grant "
                    f"{' '.join(missing)}{where} --ttl 1h"), missing_consent=missing), None
            policy.allow("consent")
        warnings: list[str] = []
        loops = policy.loops
        checked = loops.checks(caller.session)
        if checked:
            verdict = loops.before(caller.session, cap.name, raw)
            if verdict.decision == "block":
                return refuse("loop", "loop_detected", verdict.message or "loop detected"), None
            if verdict.message:
                policy.note("loop", verdict.decision, capability=cap.name, caller=caller,
                            reason=verdict.message, request_id=request_id)
                warnings.append(verdict.message)
            else:
                policy.allow("loop")
        for hook in policy.before_hooks(cap.name):
            refusal, notes = await policy.run_before(hook, cap, params, caller)
            if refusal is not None:
                return refuse("hook", "blocked", refusal), None
            if notes:
                policy.note("hook", "annotate", capability=cap.name, caller=caller,
                            reason="; ".join(notes), request_id=request_id)
                warnings.extend(notes)
            else:
                policy.allow("hook")
        result, running = await self._call(registry, policy, cap, params, caller, request_id,
                                           started, options or _PLAIN)
        # A fallback never falls back in its turn: a chain is one level deep, so no cycle
        # of declarations can make a call recurse.
        if (not fallback and not result.ok and cap.auto_fallback
                and cap.fallbacks_for(result.error_type or "")):
            result = await self._fall_back(registry, policy, cap, params, caller, request_id,
                                           result, started, options or _PLAIN)
        # "No progress" is a read answering the same again: a write acknowledging each
        # time with the same constant (or nothing) is not a loop.
        if checked and not cap.mutates_state and result.result not in (None, "", [], {}):
            verdict = loops.after(caller.session, cap.name,
                                  [result.status, result.error_type, result.result])
            if verdict.message:
                policy.note("loop", verdict.decision, capability=cap.name, caller=caller,
                            reason=verdict.message, request_id=request_id)
                warnings.append(verdict.message)
        if warnings:
            result = result.model_copy(update={"warnings": [*result.warnings, *warnings]})
        return result, running

    async def _fall_back(
        self, registry: Registry, policy: Policy, cap: Capability, params: BaseModel,
        caller: Caller, request_id: str, failed: ToolResult, started: float,
        options: _CallOptions,
    ) -> ToolResult:
        """Try the error's chain in order (read-only capabilities that opted in).

        A caller's timeout bounds the whole call: each fallback gets what is left of it
        (its own ``timeout_s`` when shorter), and none is tried once it is spent.
        """
        tried = []
        for name in cap.fallbacks_for(failed.error_type or ""):
            left_s = (None if options.timeout_s is None
                      else options.timeout_s - (self._clock() - started))
            if left_s is not None and left_s <= 0:
                break
            other = registry.get(name)
            if registry.disabled_entry(other.name) is not None or other.mutates_state:
                continue
            if not policy.visible(caller, other):
                continue
            try:
                raw = params.model_dump(mode="json")
                model = self._validate(other, raw)
            except InvalidParams:
                continue
            tried.append(other.name)
            answer, _ = await self._guarded(registry, policy, other, model, raw, caller,
                                            request_id, self._clock(), fallback=True,
                                            options=_CallOptions(left_s))
            if answer.ok:
                policy.note("fallback", "answered", capability=cap.name, caller=caller,
                            reason=f"{other.name} answered after {failed.error_type}",
                            request_id=request_id)
                return answer.model_copy(update={
                    "capability": cap.name, "answered_by": other.name,
                    "duration_s": failed.duration_s + answer.duration_s,
                    "message": (f"{cap.name} failed ({failed.error_type}: {failed.message}); "
                                f"{other.name} answered instead"),
                })
        if tried:
            policy.note("fallback", "exhausted", capability=cap.name, caller=caller,
                        reason=f"tried {', '.join(tried)}", request_id=request_id)
        return failed

    def _finish(self, registry: Registry, cap: Capability, request_id: str, started: float,
                status: ToolResultStatus, *, visible: Callable[[str], bool] | None = None,
                **fields: Any) -> ToolResult:
        if status in ("success", "partial"):
            fields.setdefault("alternatives", [])
        elif "alternatives" not in fields:
            live, why = self._alternatives(registry, cap, fields.get("error_type"))
            if visible is not None:  # a caller bound to a profile hears of nothing outside it
                live = [n for n in live if visible(n)]
                why = {n: w for n, w in why.items() if visible(n)}
            fields["alternatives"] = live
            if why:
                fields["unavailable_alternatives"] = why
        # Every field is built here from known types: skip re-validation. The dict is
        # made in field order (answers list their keys in it); ``fields`` fills it in.
        values: dict[str, Any] = {
            "status": status, "capability": cap.name, "result": None, "error_type": None,
            "message": None, "alternatives": None, "duration_s": self._clock() - started,
            "request_id": request_id, "retry_after_s": None, "queued": None,
            "warnings": [], "missing_consent": None, "unavailable_alternatives": {},
            "answered_by": None,
        }
        values.update(fields)
        return ToolResult.assemble(values)

    async def _call(
        self,
        registry: Registry,
        policy: Policy,
        cap: Capability,
        params: BaseModel,
        caller: Caller,
        request_id: str,
        started: float,
        options: _CallOptions,
    ) -> tuple[ToolResult, ThreadHandle | None]:
        """The call's result, and its thread when that still runs after the call gave up."""
        visible = None
        if policy.bindings and policy.bound(caller):
            def visible(name: str) -> bool:
                return policy.visible(caller, registry.get(name))

        def finish(status: ToolResultStatus, **fields: Any) -> ToolResult:
            return self._finish(registry, cap, request_id, started, status, visible=visible,
                                **fields)

        warnings: list[str] = []
        if registry.disabled_entry(cap.name) is not None:
            recheck = await self._rechecker.recheck_disabled_capability(cap.name)
            if not recheck.live:
                entry = registry.disabled_entry(cap.name)
                errors = dict(entry.errors) if entry else {}
                detail = "; ".join(f"{t}: {e}" for t, e in errors.items())
                missing = ", ".join(recheck.missing)
                if not options.run_disabled:
                    return finish(
                        "error_transient", error_type="capability_disabled",
                        message=f"{cap.name} is disabled: missing {missing}"
                        + (f" ({detail})" if detail else ""),
                    ), None
                refusal = self._refuse_run_disabled(registry, policy, cap, caller, request_id,
                                                    started)
                if refusal is not None:
                    return refusal, None
                policy.note("run_disabled", "annotate", capability=cap.name, caller=caller,
                            reason=f"missing {missing}", request_id=request_id)
                warnings.append(f"{cap.name} ran while disabled (missing {missing}), "
                                "as the caller asked")
        outcome = await call_capability(cap, params, executor=self._executor,
                                        timeout_s=options.timeout_s)
        apply_passive_health(registry, cap, outcome)
        if outcome.kind == "success":
            return finish("success", result=outcome.value, warnings=warnings), None
        if outcome.kind == "partial":
            return finish("partial", result=outcome.value, message=outcome.message,
                          warnings=warnings), None
        return finish(_STATUS[outcome.kind], error_type=outcome.error_type,
                      message=outcome.message, retry_after_s=outcome.retry_after_s,
                      warnings=warnings), outcome.abandoned

    def _refuse_run_disabled(self, registry: Registry, policy: Policy, cap: Capability,
                             caller: Caller, request_id: str, started: float
                             ) -> ToolResult | None:
        """The refusal of running disabled ``cap``, or None when it may run.

        A read may always run anyway; a write only under a live grant of
        ``capd.run_disabled`` (none when consent is not configured).
        """
        if not cap.mutates_state:
            return None
        wanted = (RUN_DISABLED_OPERATION,)
        missing = (list(wanted) if policy.consent is None
                   else policy.consent.missing(wanted, caller.session))
        if not missing:
            return None
        where = f" --session {shlex.quote(caller.session)}" if caller.session else ""
        return self._refuse(registry, policy, cap, caller, request_id, started, "consent",
                            "consent_required", (
            f"{cap.name} is disabled and mutates state; running it anyway needs consent for "
            f"{RUN_DISABLED_OPERATION}. Ask the user; an operator grants it with: capd consent "
            f"grant {RUN_DISABLED_OPERATION}{where} --ttl 10m"), missing_consent=missing)

    @staticmethod
    def _alternatives(registry: Registry, cap: Capability,
                      error_type: str | None) -> tuple[list[str], dict[str, str]]:
        """What to try instead: the declared chain for this error (live ones, and the
        disabled ones with why), else live capabilities sharing a tag."""
        chain = cap.fallbacks_for(error_type or "")
        if chain:
            live: list[str] = []
            why: dict[str, str] = {}
            for name in chain:
                entry = registry.disabled_entry(name)
                if entry is None:
                    live.append(name)
                else:
                    missing = ", ".join(entry.missing) or "its tools"
                    why[name] = f"disabled: missing {missing}"
            return live, why
        if not cap.tags:
            return [], {}
        tags = set(cap.tags)
        view = registry.live_view()
        return sorted(n for n, c in view.items() if n != cap.name and tags & set(c.tags))[:3], {}
