"""One call path: a call is one frozen value run through a declared list of steps.

    authorize → channel → consent → loops → before-hooks → error routing → invoke

Each step is a small unit composed the way middleware is: it gets the call and
the rest of the chain, and either answers itself (``error_blocked`` with its
reason) or awaits the rest and may look at, or add to, what comes back. Whether
a step takes part is decided by the step itself (:meth:`Step.applies`), from
the capability, the caller's grant and the policy, and the composed chain is
cached per capability and grant (:meth:`Policy.chain_for`), so a capability with
nothing to check costs only the invoke. A fallback is a new :class:`Call`
through the fallback's own chain, with the same caller.

After-hooks are not a step: they observe the final answer, after a failed write
went to the retry queue (``Gateway.dispatch``'s record phase).
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pydantic import BaseModel

from capd.registry import Capability, Registry, ThreadHandle

from .._errors import InvalidParams
from ._grant import Caller, Grant
from ._result import ToolResult

if TYPE_CHECKING:
    from ._loops import LoopVerdict
    from ._policy import Policy


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What a caller asked of this one call: a shorter timeout, running while disabled."""

    timeout_s: float | None = None
    run_disabled: bool = False


PLAIN = CallOptions()


class Call(NamedTuple):
    """One call: what is called, with what, by whom, under which registry and policy.

    ``raw`` is the parameters as the caller sent them (JSON), which loop detection
    compares; ``params`` holds the same values, validated. ``fallback`` is set on a
    call made by error routing (a fallback never falls back in its turn). Immutable
    (a tuple: made once per call, cheaply; ``_replace`` makes the fallback's).
    """

    capability: Capability
    params: BaseModel
    raw: Mapping[str, Any]
    caller: Caller
    request_id: str
    started: float
    registry: Registry
    policy: Policy
    options: CallOptions = PLAIN
    fallback: bool = False


Outcome = tuple[ToolResult, ThreadHandle | None]
"""A step's answer: the result, and the op's thread when it still runs after the call
gave up on it (the retry queue must not replay it meanwhile)."""
Next = Callable[[Call], Awaitable[Outcome]]
Link = Callable[[Call, Next], Awaitable[Outcome]]
"""A step as the chain runs it: the call and the rest of the chain."""


class Answers(Protocol):
    """What steps need of the gateway: refusing, running a fallback, the clock."""

    def refuse(self, call: Call, kind: str, error_type: str, message: str,
               **fields: Any) -> ToolResult: ...
    def validate(self, cap: Capability, params: Mapping[str, Any]) -> BaseModel:
        """``params`` as ``cap``'s model; raises ``InvalidParams``."""
        ...
    async def run(self, call: Call) -> Outcome: ...
    def clock(self) -> float: ...


class Step(Protocol):
    """One link of the chain."""

    kind: str

    def applies(self, cap: Capability, grant: Grant, policy: Policy) -> bool:
        """Whether this step has anything to do for calls of ``cap`` under ``grant``."""
        ...

    async def __call__(self, call: Call, rest: Next) -> Outcome: ...


def _with_warnings(outcome: Outcome, warnings: list[str]) -> Outcome:
    if not warnings:
        return outcome
    result, running = outcome
    return result.model_copy(update={"warnings": [*result.warnings, *warnings]}), running


class _Step:
    """What every step holds: the gateway's answers (refusing, running a fallback)."""

    def __init__(self, answers: Answers) -> None:
        self._answers = answers


class Authorize(_Step):
    """Refuse a capability outside the caller's grant. Every way in checks the grant
    before a call is made (an outside name is unknown to the caller); this step keeps
    the chain itself closed for any call that would slip past that."""

    kind = "grant"

    def applies(self, cap: Capability, grant: Grant, policy: Policy) -> bool:
        return grant.restricted

    async def __call__(self, call: Call, rest: Next) -> Outcome:
        if not call.caller.grant.allows(call.capability):
            return self._answers.refuse(call, self.kind, "not_found", (
                f"no capability {call.capability.name!r} is available to this caller")), None
        call.policy.allow(self.kind)
        return await rest(call)


class Channel(_Step):
    """Run a capability that declares ``channels`` only for a caller speaking from one."""

    kind = "channel"

    def applies(self, cap: Capability, grant: Grant, policy: Policy) -> bool:
        return bool(cap.channels)

    async def __call__(self, call: Call, rest: Next) -> Outcome:
        cap, grant = call.capability, call.caller.grant
        if not grant.speaks_for(cap):
            where = (f"this caller speaks from channel {grant.channel!r}"
                     if grant.channel is not None else "this caller names no channel")
            return self._answers.refuse(call, self.kind, "wrong_channel", (
                f"{cap.name} runs only in channel {', '.join(cap.channels)}; {where}. "
                "Call it from a conversation in that channel (capd mcp --channel NAME, or "
                "channel = ... on the caller's [[peers]] entry)")), None
        call.policy.allow(self.kind)
        return await rest(call)


class Consent(_Step):
    """Refuse a capability whose consent operations no live grant covers."""

    kind = "consent"

    def applies(self, cap: Capability, grant: Grant, policy: Policy) -> bool:
        return bool(cap.consent_operations) and policy.consent is not None

    async def __call__(self, call: Call, rest: Next) -> Outcome:
        cap, caller, policy = call.capability, call.caller, call.policy
        assert policy.consent is not None
        missing = policy.consent.missing(cap.consent_operations, caller.session)
        if missing:
            where = f" --session {shlex.quote(caller.session)}" if caller.session else ""
            return self._answers.refuse(call, self.kind, "consent_required", (
                f"{cap.name} needs consent for {', '.join(missing)}; no live grant covers "
                f"it. Ask the user; an operator grants it with: capd consent grant "
                f"{' '.join(missing)}{where} --ttl 1h"), missing_consent=missing), None
        policy.allow(self.kind)
        return await rest(call)


_WORSE = {"allow": 0, "warn": 1, "block": 2}


class Loops(_Step):
    """Count the call in its caller's session (or, without one, its peer's) and refuse a
    loop; warn on a repeat or on a read answering the same again."""

    kind = "loop"

    def applies(self, cap: Capability, grant: Grant, policy: Policy) -> bool:
        return policy.loops.policy.enabled or policy.loops.policy.require_session

    async def __call__(self, call: Call, rest: Next) -> Outcome:
        cap, caller, policy = call.capability, call.caller, call.policy
        loops = policy.loops
        if loops.policy.require_session and caller.session is None and caller.pid is not None:
            return self._answers.refuse(call, self.kind, "session_required", (
                "this daemon requires a Capd-Session header on every call ([policy.loops] "
                "require_session = true); capd mcp sends one per client")), None
        key = caller.loop_key
        if not loops.checks(key, caller.acts_as_agent):  # off, or a caller not counted
            return await rest(call)
        shared = caller.agent_key  # an agent's sessions also count together
        verdict = loops.before(key, cap.name, call.raw)
        if shared is not None:
            verdict = _worse(verdict, loops.before(shared, cap.name, call.raw))
        if verdict.decision == "block":
            return self._answers.refuse(call, self.kind, "loop_detected",
                                        verdict.message or "loop detected"), None
        warnings = self._noted(call, verdict)
        if not warnings:
            policy.allow(self.kind)
        result, running = await rest(call)
        # "No progress" is a read answering the same again: a write acknowledging each
        # time with the same constant (or nothing) is not a loop.
        if not cap.mutates_state and result.result not in (None, "", [], {}):
            answer = [result.status, result.error_type, result.result]
            verdict = loops.after(key, cap.name, answer)
            if shared is not None:
                verdict = _worse(verdict, loops.after(shared, cap.name, answer))
            warnings += self._noted(call, verdict)
        return _with_warnings((result, running), warnings)

    def _noted(self, call: Call, verdict: LoopVerdict) -> list[str]:
        """The warning ``verdict`` says (logged and counted), if any."""
        if not verdict.message:
            return []
        call.policy.note(self.kind, verdict.decision, capability=call.capability.name,
                         caller=call.caller, reason=verdict.message, request_id=call.request_id)
        return [verdict.message]


def _worse(verdict: LoopVerdict, other: LoopVerdict) -> LoopVerdict:
    return other if _WORSE[other.decision] > _WORSE[verdict.decision] else verdict


class BeforeHooks(_Step):
    """Run the before-hooks that match the capability, in order; any may refuse."""

    kind = "hook"

    def applies(self, cap: Capability, grant: Grant, policy: Policy) -> bool:
        return bool(policy.before_hooks(cap.name))

    async def __call__(self, call: Call, rest: Next) -> Outcome:
        cap, caller, policy = call.capability, call.caller, call.policy
        warnings: list[str] = []
        for hook in policy.before_hooks(cap.name):
            refusal, notes = await policy.run_before(hook, cap, call.params, caller)
            if refusal is not None:
                return self._answers.refuse(call, self.kind, "blocked", refusal), None
            if notes:
                policy.note(self.kind, "annotate", capability=cap.name, caller=caller,
                            reason="; ".join(notes), request_id=call.request_id)
                warnings.extend(notes)
            else:
                policy.allow(self.kind)
        return _with_warnings(await rest(call), warnings)


class ErrorRouting(_Step):
    """On a failure, try the capability's fallback chain for that error, in order: each
    a new call through its own chain, same caller, within what is left of the caller's
    timeout. Only live, read-only fallbacks inside the caller's grant are tried."""

    kind = "fallback"

    def applies(self, cap: Capability, grant: Grant, policy: Policy) -> bool:
        return cap.auto_fallback

    async def __call__(self, call: Call, rest: Next) -> Outcome:
        failed, running = await rest(call)
        cap = call.capability
        if call.fallback or failed.ok or not cap.fallbacks_for(failed.error_type or ""):
            return failed, running
        return await self._fall_back(call, failed), running

    async def _fall_back(self, call: Call, failed: ToolResult) -> ToolResult:
        cap, registry, policy, caller = call.capability, call.registry, call.policy, call.caller
        options = call.options
        tried = []
        raw = call.params.model_dump(mode="json")  # what each fallback is called with
        for name in cap.fallbacks_for(failed.error_type or ""):
            left_s = (None if options.timeout_s is None
                      else options.timeout_s - (self._answers.clock() - call.started))
            if left_s is not None and left_s <= 0:
                break
            other = registry.get(name)
            if registry.disabled_entry(other.name) is not None or other.mutates_state:
                continue
            if not caller.grant.allows(other):  # never run, or name, what is hidden
                continue
            try:
                model = self._answers.validate(other, raw)
            except InvalidParams:  # parameters it does not take: not an alternative here
                continue
            tried.append(other.name)
            answer, _ = await self._answers.run(call._replace(
                capability=other, params=model, raw=raw, started=self._answers.clock(),
                options=CallOptions(left_s), fallback=True))
            if answer.ok:
                policy.note(self.kind, "answered", capability=cap.name, caller=caller,
                            reason=f"{other.name} answered after {failed.error_type}",
                            request_id=call.request_id)
                return answer.model_copy(update={
                    "capability": cap.name, "answered_by": other.name,
                    "duration_s": failed.duration_s + answer.duration_s,
                    "message": (f"{cap.name} failed ({failed.error_type}: {failed.message}); "
                                f"{other.name} answered instead"),
                })
        if tried:
            policy.note(self.kind, "exhausted", capability=cap.name, caller=caller,
                        reason=f"tried {', '.join(tried)}", request_id=call.request_id)
        return failed


StepFactory = Callable[[Answers], Step]

STEPS: tuple[StepFactory, ...] = (Authorize, Channel, Consent, Loops, BeforeHooks,
                                  ErrorRouting)
"""The declared order of the chain (the invoke comes last)."""


def compose(steps: Sequence[Link], invoke: Next) -> Next:
    """``steps`` around ``invoke``, the first outermost."""
    chain = invoke
    for step in reversed(steps):
        chain = _link(step, chain)
    return chain


def _link(step: Link, rest: Next) -> Next:
    # The step's own coroutine is what the caller awaits: no frame in between.
    return lambda call: step(call, rest)
