"""Dispatch policy: validate, recheck if disabled, call under a timeout, classify.

Every call ends as a :class:`ToolResult` in one of five states. The gateway
raises only for requests that never reach a capability: an unknown name
(:class:`registry.UnknownCapability`), invalid parameters, unknown ones
included (:class:`InvalidParams`), or a daemon that is draining
(:class:`Draining`).

Before-hooks may be coroutines or plain functions; a plain one runs on the
hook executor, never on the event loop. Each runs under ``hook_timeout_s``; a
hook that raises or overruns blocks the call (fail closed) and says so.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capd.recovery import Rechecker, apply_passive_health, call_capability
from capd.registry import Blocked, Capability, Registry

from .._errors import Draining, InvalidParams
from .._logging import log_call
from ._services import Caller

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

    def as_json(self) -> dict[str, Any]:
        """The result as a JSON-ready mapping (cheaper than model_dump on the hot path)."""
        return dict(self.__dict__)

    @property
    def ok(self) -> bool:
        """Whether the call did its work, fully or in part."""
        return self.status in ("success", "partial")


BeforeHook = Callable[[Capability, BaseModel, Caller], Awaitable[None] | None]


class FailureSink(Protocol):
    """Where a transient failure of a mutating call goes (the durable retry queue).

    ``running`` is the call's thread when it was still running as the call gave
    up on it: the queue must not retry the job while it runs.
    """

    async def accept(
        self, capability: Capability, params: BaseModel, result: ToolResult,
        *, idempotency_key: str | None = None, running: Future[Any] | None = None,
    ) -> ToolResult: ...


@dataclass
class CallStats:
    """Per-capability call counters since start."""

    by_status: dict[str, Counter[str]] = field(default_factory=dict)
    total_duration_s: dict[str, float] = field(default_factory=dict)

    def record(self, result: ToolResult) -> None:
        """Count ``result``."""
        self.by_status.setdefault(result.capability, Counter())[result.status] += 1
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
        failure_sink: FailureSink | None = None,
        clock: Callable[[], float] = time.perf_counter,
        executor: Executor | None = None,
        hook_executor: Executor | None = None,
        hook_timeout_s: float = 5.0,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self._registry = registry
        self._rechecker = rechecker
        self._hooks = tuple(before_hooks)
        self._failure_sink = failure_sink
        self._clock = clock
        self._executor = executor
        self._hook_executor = hook_executor
        self.hook_timeout_s = hook_timeout_s
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self.stats = CallStats()
        self._observe: Callable[[str, float], None] = observe or (lambda _name, _duration: None)
        self._ids = itertools.count(1)
        self._id_prefix = "g" + os.urandom(3).hex()

    async def wait_idle(self) -> None:
        """Return when no call is in flight."""
        await self._idle.wait()

    async def dispatch(
        self,
        name: str,
        params: Mapping[str, Any],
        caller: Caller | None = None,
        *,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> ToolResult:
        """Call capability ``name`` with ``params`` and classify the outcome.

        A transient failure of a mutating capability goes to the failure sink
        (the retry queue), keyed by ``idempotency_key`` when given.

        Raises :class:`UnknownCapability`, :class:`InvalidParams` or
        :class:`Draining`; every other failure is a :class:`ToolResult`.
        """
        if self.draining:
            raise Draining("capd is shutting down; retry against the next instance")
        request_id = request_id or f"{self._id_prefix}-{next(self._ids):x}"
        caller = caller or Caller()
        registry = self._registry()  # this call finishes on the snapshot it started with
        cap = registry.get(name)
        unknown = cap.unknown_params(params)
        if unknown:
            raise InvalidParams(cap.name, [
                {"type": "extra_forbidden", "loc": [key], "msg": (
                    f"unknown parameter {key!r}; the parameters are "
                    f"{', '.join(sorted(cap.parameters.model_fields)) or '(none)'}")}
                for key in unknown])
        try:
            model = cap.parameters.model_validate(params)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False, include_input=False)
            raise InvalidParams(cap.name, [dict(e) for e in errors]) from exc
        self.in_flight += 1
        self._idle.clear()
        started = self._clock()
        try:
            result, running = await self._call(registry, cap, model, caller, request_id, started)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
        if (
            result.status == "error_transient"
            and cap.mutates_state
            and self._failure_sink is not None
        ):
            result = await self._failure_sink.accept(cap, model, result,
                                                    idempotency_key=idempotency_key,
                                                    running=running)
        self.stats.record(result)
        self._observe(cap.name, result.duration_s)
        log_call({
            "capability": cap.name, "status": result.status, "error_type": result.error_type,
            "duration_s": round(result.duration_s, 6), "caller_pid": caller.pid,
            "caller_uid": caller.uid, "request_id": request_id, "queued": result.queued,
        })
        return result

    async def _call(
        self,
        registry: Registry,
        cap: Capability,
        params: BaseModel,
        caller: Caller,
        request_id: str,
        started: float,
    ) -> tuple[ToolResult, Future[Any] | None]:
        """The call's result, and its thread when that still runs after the call gave up."""
        def finish(status: ToolResultStatus, **fields: Any) -> ToolResult:
            if status in ("success", "partial"):
                fields.setdefault("alternatives", [])
            else:
                fields.setdefault("alternatives", self._alternatives(registry, cap))
            fields.setdefault("result", None)
            fields.setdefault("error_type", None)
            fields.setdefault("message", None)
            fields.setdefault("retry_after_s", None)
            fields.setdefault("queued", None)
            # Every field is built here from known types: skip re-validation.
            return ToolResult.model_construct(
                status=status, capability=cap.name, request_id=request_id,
                duration_s=self._clock() - started, **fields,
            )

        if registry.disabled_entry(cap.name) is not None:
            recheck = await self._rechecker.recheck_disabled_capability(cap.name)
            if not recheck.live:
                entry = registry.disabled_entry(cap.name)
                errors = dict(entry.errors) if entry else {}
                detail = "; ".join(f"{t}: {e}" for t, e in errors.items())
                return finish(
                    "error_transient", error_type="capability_disabled",
                    message=f"{cap.name} is disabled: missing {', '.join(recheck.missing)}"
                    + (f" ({detail})" if detail else ""),
                ), None
        for hook in self._hooks:
            refusal = await self._run_hook(hook, cap, params, caller)
            if refusal is not None:
                return finish("error_blocked", error_type="blocked", message=refusal), None
        outcome = await call_capability(cap, params, executor=self._executor)
        apply_passive_health(registry, cap, outcome)
        if outcome.kind == "success":
            return finish("success", result=outcome.value), None
        if outcome.kind == "partial":
            return finish("partial", result=outcome.value, message=outcome.message), None
        return finish(_STATUS[outcome.kind], error_type=outcome.error_type,
                      message=outcome.message, retry_after_s=outcome.retry_after_s
                      ), outcome.abandoned

    async def _run_hook(self, hook: BeforeHook, cap: Capability, params: BaseModel,
                        caller: Caller) -> str | None:
        """Run one before-hook off the loop if it is plain; the refusal's reason, or None."""
        name = getattr(hook, "__qualname__", repr(hook))
        try:
            async with asyncio.timeout(self.hook_timeout_s):
                if inspect.iscoroutinefunction(hook):
                    await hook(cap, params, caller)
                else:
                    outcome = await asyncio.get_running_loop().run_in_executor(
                        self._hook_executor, partial(hook, cap, params, caller))
                    if inspect.isawaitable(outcome):
                        await outcome
        except Blocked as exc:
            return exc.message
        except TimeoutError:
            return (f"before-hook {name} did not answer within {self.hook_timeout_s:g}s; "
                    "the call is refused (hooks fail closed)")
        except Exception as exc:  # a broken hook refuses the call: fail closed
            return f"before-hook {name} failed ({type(exc).__name__}: {exc}); the call is refused"
        return None

    @staticmethod
    def _alternatives(registry: Registry, cap: Capability) -> list[str]:
        if not cap.tags:
            return []
        tags = set(cap.tags)
        live = registry.live_view()
        return sorted(n for n, c in live.items() if n != cap.name and tags & set(c.tags))[:3]
