"""The policy layer: what the daemon itself refuses, warns about or lets through.

One pipeline wraps every dispatch, in this order:

    profile → consent → loop detector → before-hooks → call
            → error router (alternatives, auto-fallback) → after-hooks

Each step may answer ``error_blocked`` with its reason. Every decision that is
not a plain "allow" is logged as a ``policy`` event with its reason, and every
decision is counted for ``capd_policy_decisions_total{kind,decision}``.

A :class:`Policy` is built from capd.toml and the registry (whose plugins mark
hooks) at start and at every reload, and swapped in with the registry; a call
finishes on the policy it started with.
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog
from pydantic import BaseModel

from capd.recovery import deadline
from capd.registry import Blocked, Capability

from ._consent import ConsentStore
from ._loops import LoopDetector, LoopPolicy
from ._peers import supplementary_groups
from ._services import Caller

log = structlog.get_logger("capd.policy")

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


@dataclass(frozen=True, slots=True)
class Profile:
    """A named set of capabilities (name globs and tags) a caller may use."""

    name: str
    capabilities: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def allows(self, cap: Capability) -> bool:
        """Whether ``cap`` is inside this profile."""
        if any(fnmatch.fnmatchcase(cap.name, glob) for glob in self.capabilities):
            return True
        return bool(set(self.tags) & set(cap.tags))


@dataclass(frozen=True, slots=True)
class PeerBinding:
    """Callers (by uid or gid) bound to a profile."""

    profile: str
    uid: int | None = None
    gid: int | None = None

    def matches(self, caller: Caller) -> bool:
        """Whether ``caller`` is one this binding names (a gid: primary or supplementary,
        the same groups the peer allowlist lets in by)."""
        if self.uid is not None and caller.uid == self.uid:
            return True
        if self.gid is None:
            return False
        if caller.gid == self.gid:
            return True
        return caller.pid is not None and self.gid in supplementary_groups(caller.pid)


@dataclass
class Policy:
    """Profiles, consent, loop detection and hooks, as one object per registry."""

    profiles: Mapping[str, Profile] = field(default_factory=dict)
    bindings: Sequence[PeerBinding] = ()
    consent: ConsentStore | None = None
    loops: LoopDetector = field(
        default_factory=lambda: LoopDetector(LoopPolicy(enabled=False)))
    before: Sequence[NamedHook] = ()
    after: Sequence[NamedHook] = ()
    hook_timeout_s: float = 5.0
    hook_executor: Executor | None = None
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    # capability name -> the hooks that apply, in order (the patterns are fixed per policy)
    _before_for: dict[str, list[NamedHook]] = field(default_factory=dict, repr=False)
    _after_for: dict[str, list[NamedHook]] = field(default_factory=dict, repr=False)
    # caller -> its profile: one call asks several times (profile step, alternatives,
    # suggestions), and a gid binding reads /proc each time it is matched
    _profile_of: dict[Caller, Profile | None] = field(default_factory=dict, repr=False)

    def applies(self, cap: Capability, caller: Caller) -> bool:
        """Whether the pipeline has anything to do for ``caller``'s call to ``cap``: a
        binding or a hook, consent the capability declares, a loop check of the caller's
        session, or the capability's own fallback chain. A call with none skips it."""
        return bool(self.bindings or self.before or self.after or cap.auto_fallback
                    or (cap.consent_operations and self.consent is not None)
                    or self.loops.checks(caller.session))

    # -- profiles ----------------------------------------------------------------------

    def profile_for(self, caller: Caller) -> Profile | None:
        """The profile ``caller`` is bound to, or None (unrestricted)."""
        if caller in self._profile_of:
            return self._profile_of[caller]
        found = next((self.profiles[b.profile] for b in self.bindings if b.matches(caller)),
                     None)
        if len(self._profile_of) >= 4096:  # bounded: callers come and go by pid
            self._profile_of.clear()
        self._profile_of[caller] = found
        return found

    def bound(self, caller: Caller) -> bool:
        """Whether ``caller`` is bound to a profile (then never an operator)."""
        return bool(self.bindings) and self.profile_for(caller) is not None

    @property
    def profile_names(self) -> list[str]:
        """The declared profiles' names."""
        return sorted(self.profiles)

    def in_profile(self, profile: str, cap: Capability) -> bool:
        """Whether the declared profile ``profile`` takes in ``cap`` (KeyError if none)."""
        return self.profiles[profile].allows(cap)

    def visible(self, caller: Caller, cap: Capability) -> bool:
        """Whether ``caller`` may see and call ``cap``."""
        profile = self.profile_for(caller) if self.bindings else None
        return profile is None or profile.allows(cap)

    # -- decisions ---------------------------------------------------------------------

    def allow(self, kind: str) -> None:
        """Count a plain allow (the common case: no log line)."""
        self.decisions[kind, "allow"] += 1

    def note(self, kind: str, decision: str, *, capability: str, caller: Caller,
             reason: str | None = None, request_id: str | None = None) -> None:
        """Count a decision; log it unless it is a plain allow."""
        self.decisions[kind, decision] += 1
        if decision != "allow":
            log.info("policy", kind=kind, decision=decision, capability=capability,
                     reason=reason, caller_uid=caller.uid, caller_pid=caller.pid,
                     session=caller.session, request_id=request_id)

    # -- hooks -------------------------------------------------------------------------

    def before_hooks(self, capability: str) -> list[NamedHook]:
        """The before-hooks that apply to ``capability``, in configured order."""
        hooks = self._before_for.get(capability)
        if hooks is None:
            hooks = self._before_for[capability] = [
                h for h in self.before if h.matches(capability)]
        return hooks

    def after_hooks(self, capability: str) -> list[NamedHook]:
        """The after-hooks that apply to ``capability``, in configured order."""
        hooks = self._after_for.get(capability)
        if hooks is None:
            hooks = self._after_for[capability] = [
                h for h in self.after if h.matches(capability)]
        return hooks

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
        except Exception as exc:  # a broken hook refuses the call: fail closed
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
        except Exception as exc:  # an observer's failure never changes the answer
            log.warning("after_hook_failed", hook=hook.name, capability=cap.name,
                        error=f"{type(exc).__name__}: {exc}")


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
