"""What serves now: one :class:`Generation`, built by one function at start-up and reload.

A generation is the configuration read from capd.toml, the registry built from it
(its search index inside it) and the policy made from both. The daemon holds one and
replaces it with one assignment; a call in flight keeps the generation it started
with. :func:`build_generation` makes the first one (nothing serves yet: the search
index is built once the daemon serves) and every later one (something serves: a
declaration file that no longer loads fails the build, and the index is built
before the swap), so start-up and reload cannot drift apart.
"""

from __future__ import annotations

import asyncio
import difflib
import os
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import structlog

from capd.registry import ConfigError, Registry, UpstreamPool, build

from ._authority import Authority, PeerBinding
from ._config import LoadedConfig
from ._consent import ConsentStore
from ._engines import run_as_ids, with_agents
from ._grant import Profile
from ._loops import LoopDetector, LoopPolicy
from ._policy import NamedHook, Policy
from ._runs import EngineRuns
from ._ssrf import SsrfGuard

log = structlog.get_logger("capd.generation")

HOST_BOUND_EFFECTS = frozenset({"file_contains", "file_exists"})
"""Effects only the host that made the write can check: a local file. An http, command or
op effect is checked from wherever the job is replayed."""


@dataclass(frozen=True, slots=True)
class Generation:
    """The configuration, registry and policy that serve together."""

    loaded: LoadedConfig
    registry: Registry
    policy: Policy

    def counts(self) -> dict[str, int]:
        """The registry's live, disabled and error counts."""
        return self.registry.counts()


    @classmethod
    def empty(cls, loaded: LoadedConfig, decisions: Counter[tuple[str, str]],
              recent: deque[dict[str, Any]]) -> Generation:
        """The generation before the first build: nothing configured, nothing served."""
        return cls(loaded, Registry((), {}, {}), Policy(decisions=decisions, recent=recent))


@dataclass(frozen=True)
class Builder:
    """What every generation is built with: the process's parts that outlive a reload
    (the policy's decision counts included)."""

    executor: Executor  # plain probes and hooks
    upstreams: UpstreamPool
    runs: EngineRuns
    agent_config: Callable[[str, Mapping[str, str]], dict[str, Any]]
    consent: ConsentStore
    decisions: Counter[tuple[str, str]]
    recent: deque[dict[str, Any]]


async def build_generation(builder: Builder, loaded: LoadedConfig,
                           previous: Generation | None) -> Generation:
    """Build the generation ``loaded`` asks for; ``previous`` is the one serving (None at
    start-up). Probes run concurrently; plugins are imported afresh.

    Raises :class:`CapdError` with a clear message (a declaration file that no longer
    loads while something serves, a bad agent, a hook no plugin has); the caller keeps
    serving ``previous`` then.
    """
    registry = await build(loaded.build_config(), executor=builder.executor,
                           upstreams=builder.upstreams)
    unloaded = [e for e in registry.snapshot().errors if e.whole_file]
    if previous is not None and unloaded:  # what it declares would vanish, and its jobs
        raise ConfigError("; ".join(str(e) for e in unloaded) + ": a declaration file "
                          "that does not load fails the reload (the registry serving "
                          "now is kept); fix it and reload again")
    registry = _with_agents(builder, registry, loaded)
    policy = _make_policy(builder, loaded, registry, previous)
    if previous is not None:  # at start-up the index is built once the daemon serves
        await asyncio.to_thread(registry.prepare_search, loaded.state_dir() / "search")
    return Generation(loaded, registry, policy)


def _with_agents(builder: Builder, registry: Registry, loaded: LoadedConfig) -> Registry:
    """``registry`` with a capability for each agent that declares an engine (and, for a
    shared queue, no capability whose replay only its own host could verify)."""
    if loaded.config.queue_url:
        _refuse_host_bound_verification(registry)
    for name, spec in loaded.agents.items():
        try:
            run_as_ids(spec)
        except ValueError as exc:
            raise ConfigError(f"[agents.{name}]: {exc}") from exc
        if spec.engine is None:
            continue
        if spec.run_as is not None and os.geteuid() != 0:
            log.warning("agent_run_as_ignored", agent=name, run_as=spec.run_as,
                        hint="only a daemon running as root can run an engine as "
                        "another user; the engine runs as the daemon's user")
        elif spec.run_as is None and os.geteuid() == 0:
            log.warning("agent_engine_as_root", agent=name,
                        hint="the engine runs as root and can leave any tracking; set "
                        "run_as = \"capd-agent\" (made by the units' sysusers.d)")
    try:
        return with_agents(registry, loaded.agents, builder.agent_config, builder.runs)
    except ValueError as exc:
        raise ConfigError(f"[agents]: {exc} (an agent with an engine is the capability "
                          "agent.NAME; rename the one declared by that name)") from exc


def _refuse_host_bound_verification(registry: Registry) -> None:
    """Raise :class:`ConfigError` naming each ``verify_first`` capability whose effects are
    all on its own host's files: with a shared queue, another daemon may replay its job and
    could not see them, so it would write twice."""
    snap = registry.snapshot()
    bound = sorted(
        name for name in [*snap.live, *snap.disabled]
        if (cap := registry.get(name)).retry_policy == "verify_first"
        and all(effect.kind in HOST_BOUND_EFFECTS for effect in cap.effects))
    if bound:
        raise ConfigError(
            f"queue_url is a shared queue, but {', '.join(bound)} "
            f"{'verifies' if len(bound) == 1 else 'verify'} a replay only by this host's files "
            "(file_exists, file_contains): another daemon replaying the job could not see them. "
            "Declare an http, command or op effect any host can check, or retry_policy = "
            "'replay' or 'manual'")


def _make_policy(builder: Builder, loaded: LoadedConfig, registry: Registry,
                 previous: Generation | None) -> Policy:
    """The policy capd.toml asks for, with hooks from ``registry``'s plugins; loop counts
    carry over from ``previous`` while the thresholds stay the same.

    Raises :class:`ConfigError` naming a hook that neither a plugin nor capd has.
    """
    config = loaded.config
    policy = config.policy
    loops = LoopPolicy(**policy.loops.model_dump())
    detector = previous.policy.loops if previous is not None else None
    if detector is None or detector.policy != loops:
        detector = LoopDetector(loops)
    builtins: dict[str, NamedHook] = {
        "capd:ssrf_guard": NamedHook("capd:ssrf_guard", SsrfGuard(policy.ssrf.allow)),
    }

    def resolve(name: str, kind: str) -> NamedHook:
        if name in builtins and kind == "before":
            return builtins[name]
        spec = registry.hooks.get(name)
        if spec is not None and spec.kind == kind:
            return NamedHook(name, spec.func, spec.pattern)
        known = sorted([*builtins, *(k for k, s in registry.hooks.items() if s.kind == kind)])
        close = difflib.get_close_matches(name, known, n=1)
        why = (f"{name!r} is an {spec.kind}-call hook" if spec is not None else
               f"no plugin marks a hook {name!r}")
        raise ConfigError(
            f"[policy] {kind} = [...]: {why}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; {kind}-call hooks: {', '.join(known) or 'none'}")

    authority = Authority(
        allow_uids=config.allow_uids, allow_gids=config.allow_gids,
        operator_uids=config.operator_uids,
        profiles={name: Profile(name, tuple(p.capabilities), tuple(p.tags))
                  for name, p in config.profiles.items()},
        bindings=[PeerBinding(p.profile, p.uid, p.gid, p.channel) for p in config.peers])
    return Policy(
        authority=authority,
        consent=builder.consent, loops=detector,
        before=[resolve(name, "before") for name in policy.before],
        after=[resolve(name, "after") for name in policy.after],
        hook_timeout_s=config.hook_timeout_s, hook_executor=builder.executor,
        decisions=builder.decisions, recent=builder.recent)
