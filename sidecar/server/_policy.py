"""The policy layer: what the daemon itself refuses, warns about or lets through.

One chain of steps wraps every dispatch (``_steps.py``), in this order:

    authorize → channel → consent → loop detector → before-hooks
              → error routing (auto-fallback) → invoke; then after-hooks

Each step may answer ``error_blocked`` with its reason. Every decision that is
not a plain "allow" is logged as a ``policy`` event with its reason, and every
decision is counted for ``capd_policy_decisions_total{kind,decision}``.

A :class:`Policy` is built from capd.toml and the registry (whose plugins mark
hooks) at start and at every reload, and swapped in with the registry; a call
finishes on the policy it started with. It holds the generation's
:class:`~._authority.Authority` (who a peer is and what it may reach), so a
reload that revokes a uid takes effect on that uid's next request.
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog
from pydantic import BaseModel

from capd.recovery import deadline
from capd.registry import USER_CODE_FAILURES, Blocked, Capability

from ._authority import Authority
from ._consent import ConsentStore
from ._grant import Caller
from ._loops import LoopDetector, LoopPolicy

log = structlog.get_logger("capd.policy")

RECENT = 50
"""How many recent refusals (and other decisions that are not a plain allow) are kept for
``/status`` and ``capd top``."""

HookFunc = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class NamedHook:
    """A hook enabled in capd.toml: its name, the capabilities it applies to, the function."""

    name: str
    func: HookFunc
    pattern: str = "*"
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", _is_async(self.func))

    def matches(self, capability: str) -> bool:
        """Whether this hook applies to ``capability``."""
        return self.pattern == "*" or fnmatch.fnmatchcase(capability, self.pattern)


@dataclass
class Policy:
    """Profiles, consent, loop detection and hooks, as one object per registry."""

    authority: Authority = field(default_factory=Authority)
    consent: ConsentStore | None = None
    loops: LoopDetector = field(
        default_factory=lambda: LoopDetector(LoopPolicy(enabled=False)))
    before: Sequence[NamedHook] = ()
    after: Sequence[NamedHook] = ()
    hook_timeout_s: float = 5.0
    hook_executor: Executor | None = None
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT))
    """The last :data:`RECENT` decisions that were not a plain allow, newest last."""
    # capability name -> the hooks that apply, in order (the patterns are fixed per policy)
    _before_for: dict[str, list[NamedHook]] = field(default_factory=dict, repr=False)
    _after_for: dict[str, list[NamedHook]] = field(default_factory=dict, repr=False)

    # -- grants ------------------------------------------------------------------------

    def bound(self, caller: Caller) -> bool:
        """Whether some capability is outside ``caller``'s grant (then it hears of none)."""
        return caller.grant.restricted

    @property
    def profile_names(self) -> list[str]:
        """The declared profiles' names."""
        return sorted(self.authority.profiles)

    def in_profile(self, profile: str, cap: Capability) -> bool:
        """Whether the declared profile ``profile`` takes in ``cap`` (KeyError if none)."""
        return self.authority.profiles[profile].allows(cap)

    def visible(self, caller: Caller, cap: Capability) -> bool:
        """Whether ``caller`` may see and call ``cap``."""
        return caller.grant.allows(cap)

    # -- decisions ---------------------------------------------------------------------

    def allow(self, kind: str) -> None:
        """Count a plain allow (the common case: no log line)."""
        self.decisions[kind, "allow"] += 1

    def note(self, kind: str, decision: str, *, capability: str, caller: Caller,
             reason: str | None = None, request_id: str | None = None) -> None:
        """Count a decision; log it unless it is a plain allow."""
        self.decisions[kind, decision] += 1
        if decision != "allow":
            self.recent.append({"at": time.time(), "kind": kind, "decision": decision,
                                "capability": capability, "reason": reason,
                                "session": caller.session, "uid": caller.uid})
            log.info("policy", kind=kind, decision=decision, capability=capability,
                     reason=reason, caller_uid=caller.uid, caller_pid=caller.pid,
                     grant=caller.grant.describe(), session=caller.session,
                     request_id=request_id)

    # -- hooks -------------------------------------------------------------------------

    def before_hooks(self, capability: str) -> list[NamedHook]:
        """The before-hooks that apply to ``capability``, in configured order."""
        return _matching(self._before_for, self.before, capability)

    def after_hooks(self, capability: str) -> list[NamedHook]:
        """The after-hooks that apply to ``capability``, in configured order."""
        return _matching(self._after_for, self.after, capability)

    async def run_hook(self, hook: NamedHook, *args: Any) -> Any:
        """Run one hook under the timeout, off the loop if it is plain; return its value.

        The timeout is the calls' shared deadline ticker (a hook may overrun by up to
        its resolution, 20 ms), not a timer per hook run.
        """
        async with deadline(self.hook_timeout_s):
            if hook.is_async:
                return await hook.func(*args)
            value = await asyncio.get_running_loop().run_in_executor(
                self.hook_executor, partial(hook.func, *args))
            if inspect.isawaitable(value):
                value = await value
            return value

    async def run_before(self, hook: NamedHook, cap: Capability, params: BaseModel,
                         caller: Caller) -> tuple[str | None, list[str]]:
        """Run a before-hook: (the refusal's reason or None, its annotations)."""
        try:
            if hook.is_async:  # the common case, without run_hook's extra frame
                async with deadline(self.hook_timeout_s):
                    value = await hook.func(cap, params, caller)
            else:
                value = await self.run_hook(hook, cap, params, caller)
        except Blocked as exc:
            return exc.message, []
        except TimeoutError:
            return (f"before-hook {hook.name} did not answer within {self.hook_timeout_s:g}s; "
                    "the call is refused (hooks fail closed)"), []
        except USER_CODE_FAILURES as exc:  # a broken hook refuses the call: fail closed
            return (f"before-hook {hook.name} failed ({type(exc).__name__}: {exc}); the call "
                    "is refused (hooks fail closed)"), []
        return None, _annotations(hook.name, value)

    async def run_after(self, hook: NamedHook, cap: Capability, params: BaseModel, caller: Caller,
                    result: Any) -> None:
        """Run an after-hook; it observes, so its failure is logged and changes nothing."""
        try:
            if hook.is_async:
                async with deadline(self.hook_timeout_s):
                    await hook.func(cap, params, caller, result)
            else:
                await self.run_hook(hook, cap, params, caller, result)
        except USER_CODE_FAILURES as exc:  # an observer's failure never changes the answer
            log.warning("after_hook_failed", hook=hook.name, capability=cap.name,
                        error=f"{type(exc).__name__}: {exc}")


def _matching(cache: dict[str, list[NamedHook]], hooks: Sequence[NamedHook],
              capability: str) -> list[NamedHook]:
    found = cache.get(capability)
    if found is None:
        found = cache[capability] = [h for h in hooks if h.matches(capability)]
    return found


def _is_async(func: HookFunc) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one (the SSRF guard)."""
    if inspect.iscoroutinefunction(func):
        return True
    return not inspect.isroutine(func) and inspect.iscoroutinefunction(type(func).__call__)


def _annotations(name: str, value: Any) -> list[str]:
    """What a before-hook returned to annotate the call (a string or strings)."""
    if value is None or value is True:
        return []
    if isinstance(value, str):
        return [f"{name}: {value}"]
    if isinstance(value, Iterable):
        return [f"{name}: {v}" for v in value if isinstance(v, str)]
    return []
