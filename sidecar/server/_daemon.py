"""The daemon: owns the registry, the rechecker, the gateway and every task.

Start-up reads as phases: lock the state directory → open the queue → build →
bind socket → serve → ready. Shutdown too: draining (new calls refused with
503) → wait for in-flight calls within the grace period → close the server →
stop background tasks → remove the socket file.

No code a user wrote runs on the event loop unless it is a coroutine: plain
ops run on ``op_executor``; plain probes, effect verifiers and before-hooks on
``user_executor``; each under its own timeout.
"""

from __future__ import annotations

import asyncio
import difflib
import gc
import math
import os
import resource
import signal
import time
from collections import Counter, deque
from collections.abc import Awaitable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import structlog

from capd.recovery import (
    JobQueue,
    PgRetryQueue,
    QueueStats,
    Rechecker,
    RecoveryError,
    RetryQueue,
    RetrySweep,
    RunningAttempts,
    tracing,
)
from capd.registry import (
    ConfigError,
    OpThreads,
    Registry,
    UpstreamError,
    UpstreamPool,
    build,
    refresh_upstream,
    run_probe,
)

if TYPE_CHECKING:
    from capd.registry import SearchIndex

    from ._config import McpHttpConfig
    from ._mcp_http import FrontDoors

from .._errors import ListenFailed, SearchUnavailable
from .._paths import capd_version, default_socket_path
from ._agents import BridgeLaunch, capd_command, claude_config, resolve_agent
from ._api import Api
from ._authority import Authority, PeerBinding
from ._config import LoadedConfig, load_config
from ._consent import ConsentStore
from ._engines import bridge_config, run_as_ids, with_agents
from ._gateway import Gateway
from ._grant import Grant, Profile
from ._http import HttpServer
from ._loops import LoopDetector, LoopPolicy
from ._metrics import Metrics
from ._peers import RateLimiter
from ._policy import RECENT, NamedHook, Policy
from ._queueing import QueueSink
from ._reload import Reloader
from ._runs import EngineRuns
from ._socket import bind_unix_socket, remove_socket, socket_inode
from ._ssrf import SsrfGuard
from ._statelock import acquire_state_lock
from ._streams import Streams
from ._systemd import Notifier, inherited_socket, run_watchdog, watchdog_interval_s
from ._tokens import TokenStore

LIST_CHANGED_SETTLE_S = 0.5
"""How long a server's notifications/tools/list_changed settle into one reload."""

log = structlog.get_logger("capd.daemon")

T = TypeVar("T")
State = Literal["starting", "ready", "draining", "stopped"]


FD_RESERVE = 256
"""Descriptors kept out of the connection cap (queue, probes, subprocesses, logs)."""
STATS_TIMEOUT_S = 5.0
"""How long a read of the queue's counts may take before health reports the queue failing."""
STATS_STALE_S = 5.0
"""How old the last counts may be and still be answered while a new read runs."""
EXPIRE_EVERY_S = 60.0
"""How often finished jobs past ``queue_retention_s`` are looked for."""
DOOR_ACCEPT_SLACK = 512
"""Descriptors the HTTP front door may hold past its cap for a moment: connections
accepted in one go (its listen backlog) before the evicted ones are closed."""


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (never past the hard limit); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("fd_limit_unchanged", soft=soft, wanted=target, error=str(exc))
            return soft
        return target
    return soft


_T = TypeVar("_T")


class Daemon:
    """One capd process. Build it, then ``await run()``; ``request_stop()`` ends it."""

    stall_threshold_s = 5.0
    lag_interval_s = 0.5

    def __init__(self, loaded: LoadedConfig, *, socket_path: Path | None = None) -> None:
        self.loaded = loaded
        config = loaded.config
        self.socket_path = socket_path or (
            loaded.resolve(config.socket) if config.socket else default_socket_path()
        )
        self.version = capd_version()
        self.pid = os.getpid()
        # Traces when OTEL_* variables ask for them (and the SDK is there): before the
        # gateway, which decides once whether to make spans.
        why_not = tracing.enable_tracing(self.version)
        if why_not is not None:
            log.warning("tracing_off", reason=why_not)
        elif tracing.TRACER is not None:
            log.info("tracing_on")
        self.state: State = "starting"
        self.loop_lag_s = 0.0
        self._started = time.monotonic()
        self._stop = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self.registry: Registry = Registry((), {}, {})
        # Plain (sync) ops run here, not on asyncio's default executor, whose threads the
        # loop waits for at close: a hung op must not hold a stopping daemon.
        self.op_executor = OpThreads(max_workers=32, thread_name_prefix="capd-op")
        # Plain probes, verifiers and hooks: apart from ops, so hung ops cannot starve probes.
        self.user_executor = ThreadPoolExecutor(max_workers=config.user_code_threads,
                                                thread_name_prefix="capd-user")
        # One client session per upstream MCP server, kept across reloads; a server's
        # tools/list_changed reloads the registry so its new tools become capabilities.
        self.upstreams = UpstreamPool(on_tools_changed=self._upstream_tools_changed)
        self.streams = Streams()  # the streamed calls running now (their questions)
        # Bearer tokens of the MCP front door over HTTP (hashed, in the state directory).
        self.tokens = TokenStore(loaded.state_dir() / "tokens.json")
        self._tools_changed: set[str] = set()  # servers whose burst of changes is settling
        self._vanished: dict[str, float] = {}  # capability -> when a reload took it away
        self.rechecker = Rechecker(
            lambda: self.registry, cooldown_s=config.recheck_cooldown_s,
            probe=partial(run_probe, executor=self.user_executor, upstreams=self.upstreams))
        self.running_attempts = RunningAttempts()
        self.queue: JobQueue | None = None  # opened by run(); the sink answers NOT queued before
        self.metrics = Metrics(self)
        # The policy is made from capd.toml and the registry's hooks once both exist, and
        # again at each reload; until then, nothing is configured (and nothing is served).
        self.consent: ConsentStore | None = None
        self.policy_decisions: Counter[tuple[str, str]] = Counter()
        self.policy_recent: deque[dict[str, Any]] = deque(maxlen=RECENT)  # across reloads
        self.policy = Policy(decisions=self.policy_decisions, recent=self.policy_recent)
        self._next_policy: Policy | None = None
        self.gateway = Gateway(lambda: self.registry, self.rechecker, policy=lambda: self.policy,
                               executor=self.op_executor, hook_executor=self.user_executor,
                               hook_timeout_s=config.hook_timeout_s,
                               failure_sink=QueueSink(lambda: self.queue, self.running_attempts,
                                                      verify_grace_s=config.verify_grace_s),
                               observe=self.metrics.observe_call)
        self.notifier = Notifier()
        self.reloader = Reloader(self._rebuild, self._swap, spawn=self.spawn,
                                 on_start=self.notifier.reloading, on_end=self._reloaded)
        self.inherited_socket = False
        self._queue_stats: tuple[float, QueueStats | str] | None = None  # str: the error
        self._stats_refresh: asyncio.Task[None] | None = None
        self.sweep: RetrySweep | None = None
        self.http: HttpServer | None = None
        self.front_doors: FrontDoors | None = None  # made at start, switched at each reload
        self._drained = asyncio.Event()  # in-flight calls done (or the grace spent)
        # agents' engine runs: each held to its agent's grant, all its processes killed
        self.runs = EngineRuns()
        # The start-up registry's search index, built in a thread once the daemon serves
        # (a reload builds its registry's index before swapping it in).
        self._search_build: tuple[Registry, asyncio.Task[SearchIndex]] | None = None
        self._boosts: tuple[float, Mapping[str, float]] | None = None
        # (index, what a grant reaches) -> the index of that reach, least recently used first
        self._visible_indexes: dict[tuple[int, tuple[int, ...]],
                                    tuple[SearchIndex, SearchIndex]] = {}

    def _upstream_tools_changed(self, tool: str) -> None:
        """A server said its tools changed: one refresh of that server's capabilities
        after the burst settles (a server announcing a hundred changes a second gets one
        refresh, not a hundred), not a full reload."""
        if tool in self._tools_changed:
            return
        self._tools_changed.add(tool)
        self.spawn(self._refresh_upstream(tool))

    async def _refresh_upstream(self, tool: str) -> None:
        """Make ``tool``'s capabilities again from its new list and swap them in. A reload
        that ran meanwhile leaves the refresh to be made on what it built; a name that
        clashes with another capability's takes a full reload (which reports it)."""
        await asyncio.sleep(LIST_CHANGED_SETTLE_S)
        while self.state == "starting":  # noqa: ASYNC110 (the start-up registry is not in place)
            await asyncio.sleep(0.1)
        self._tools_changed.discard(tool)  # a change announced from now on is a new burst
        for _ in range(3):
            if self.reloader.running:
                await self.reloader.reload()  # its follow-up lists every server anew
                return
            base = self.registry
            if not base.has_tool(tool):
                return
            started = time.monotonic()
            try:
                registry = await refresh_upstream(base, tool, self.upstreams)
            except UpstreamError as exc:  # its probe marks it down; the old list stays
                log.warning("upstream_refresh_failed", tool=tool, error=str(exc))
                return
            except ValueError as exc:
                log.warning("upstream_refresh_clash", tool=tool, error=str(exc))
                await self.reloader.reload()
                return
            await asyncio.to_thread(registry.prepare_search, self.loaded.state_dir() / "search")
            if self.registry is base and not self.reloader.running:
                self.registry = registry  # the policy and everything else stay as they are
                log.info("upstream_refreshed", tool=tool, capabilities=len(registry),
                         duration_s=round(time.monotonic() - started, 4))
                return

    @property
    def health_pending_age_s(self) -> float:
        """A pending job older than this makes /health warn."""
        return self.loaded.config.health_pending_age_s

    @property
    def uptime_s(self) -> float:
        """Seconds since the daemon object was made."""
        return time.monotonic() - self._started

    def spawn(self, coro: Awaitable[T]) -> asyncio.Task[T]:
        """Start an owned background task; its failure is logged, never lost."""
        async def wrapper() -> T:
            return await coro

        task = asyncio.get_running_loop().create_task(wrapper())
        self._background.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task_failed", task=task.get_name(), error=repr(task.exception()))

    def task_stats(self) -> dict[str, int]:
        """Counts of owned background tasks, and of every task on the loop (a figure that
        must stay flat over a long run)."""
        return {"background": len(self._background), "all": len(asyncio.all_tasks())}

    def request_stop(self) -> None:
        """Begin the shutdown sequence (idempotent)."""
        if not self._stop.is_set():
            log.info("stop_requested")
            self._stop.set()

    def _with_agents(self, registry: Registry, loaded: LoadedConfig) -> Registry:
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
            return with_agents(registry, loaded.agents, self._agent_config, self.runs)
        except ValueError as exc:
            raise ConfigError(f"[agents]: {exc} (an agent with an engine is the capability "
                              "agent.NAME; rename the one declared by that name)") from exc

    def _agent_config(self, name: str, context: Mapping[str, str]) -> dict[str, Any]:
        """The MCP configuration agent ``name`` runs with in ``context``: the capd bridge
        held to what it resolves to now."""
        resolution = resolve_agent(
            name, agents=self.loaded.agents, injections=self.loaded.injections,
            registry=self.registry, context=context,
            bridge=BridgeLaunch(capd_command(), self.socket_path))
        return bridge_config(claude_config(resolution))

    async def _rebuild(self) -> Registry:
        loaded = await asyncio.to_thread(load_config, self.loaded.path)
        registry = await build(loaded.build_config(), executor=self.user_executor,
                               upstreams=self.upstreams)
        unloaded = [e for e in registry.snapshot().errors if e.whole_file]
        if unloaded:  # what that file declares would vanish, and its jobs with it
            raise ConfigError("; ".join(str(e) for e in unloaded) + ": a declaration file "
                              "that does not load fails the reload (the registry serving "
                              "now is kept); fix it and reload again")
        registry = self._with_agents(registry, loaded)
        await asyncio.to_thread(registry.prepare_search, loaded.state_dir() / "search")
        # A hook name that no longer resolves fails the reload; the old policy stays.
        self._next_policy = self._make_policy(loaded, registry)
        # Last: a new address that cannot be bound fails the reload, the old door serving.
        await self._switch_front_door(loaded.config.mcp.http)
        self.loaded = loaded
        return registry

    def _build_search_soon(self, registry: Registry) -> asyncio.Task[SearchIndex]:
        async def build() -> SearchIndex:
            started = time.monotonic()
            index = await asyncio.to_thread(registry.prepare_search,
                                            self.loaded.state_dir() / "search")
            log.info("search_ready", capabilities=len(registry),
                     duration_s=round(time.monotonic() - started, 3))
            return index

        task = self.spawn(build())
        self._search_build = (registry, task)
        return task

    @property
    def front_door(self) -> dict[str, Any] | None:
        """The HTTP front door serving now, as ``capd status`` shows it (None: none)."""
        return self.front_doors.view() if self.front_doors is not None else None

    @property
    def operator_tools(self) -> list[str]:
        """The operator commands ``capd mcp`` offers as tools too (``[mcp] operator_tools``)."""
        return list(self.loaded.config.mcp.operator_tools)

    @property
    def mcp_tool_set(self) -> str:
        """The meta tools a front door lists (``[mcp] tools``): brief or full."""
        return self.loaded.config.mcp.tools

    def success_boosts(self, max_age_s: float = 1.0) -> Mapping[str, float]:
        """Each called capability's search boost from its success rate, made again at most
        every ``max_age_s`` (thousands of called capabilities take milliseconds)."""
        now = time.monotonic()
        if self._boosts is None or now - self._boosts[0] > max_age_s:
            from capd.registry import success_boost  # with the search stack, when searched

            self._boosts = (now, success_boost(self.gateway.stats.by_status))
        return self._boosts[1]

    async def search_index(self, grant: Grant | None = None) -> SearchIndex:
        """The serving registry's search index, or for a restricted ``grant`` the index of
        what it may see (kept per reach, made off the loop); waits while it is built.

        A build that failed is tried again by the next search, which answers the
        failure meanwhile.
        """
        index = await self._full_search_index()
        if grant is None or not grant.restricted:
            return index
        # by what the grant reaches (not by how the caller spelled it: a new label or
        # order makes no new index), computed off the loop
        reach = await asyncio.to_thread(index.reach, grant.allows)
        key = (id(index), reach)
        found = self._visible_indexes.get(key)
        if found is None or found[0] is not index:
            subset = await asyncio.to_thread(index.subset, reach)
            while len(self._visible_indexes) >= 64:  # the least recently used goes first
                self._visible_indexes.pop(next(iter(self._visible_indexes)))
            found = self._visible_indexes[key] = (index, subset)
        else:
            self._visible_indexes.pop(key)
            self._visible_indexes[key] = found  # now the most recently used
        return found[1]

    async def _full_search_index(self) -> SearchIndex:
        registry = self.registry
        if registry.search_prepared:
            return registry.search_index()
        pending = self._search_build
        if pending is None or pending[0] is not registry or (
                pending[1].done() and (pending[1].cancelled()
                                       or pending[1].exception() is not None)):
            task = self._build_search_soon(registry)
        else:
            task = pending[1]
        try:
            return await asyncio.shield(task)
        except Exception as exc:  # the build's own error, whatever it is: say it, retry later
            raise SearchUnavailable(
                f"the search index could not be built ({type(exc).__name__}: {exc}); the "
                "next search tries again, and `capd reload` rebuilds it") from exc

    def _swap(self, registry: Registry) -> None:
        # capabilities a reload took away (their queued jobs wait for them, not parked)
        old = self.registry.snapshot()
        gone = {name for name in (*old.live, *old.disabled) if name not in registry}
        for name in [n for n in self._vanished if n in registry]:
            del self._vanished[name]  # back: its jobs run again
        self._vanished.update(dict.fromkeys(gone, time.time()))
        self.registry = registry
        if self._next_policy is not None:
            self.policy, self._next_policy = self._next_policy, None
        self.rechecker.cooldown_s = self.loaded.config.recheck_cooldown_s

    def _make_policy(self, loaded: LoadedConfig, registry: Registry) -> Policy:
        """The policy capd.toml asks for, with hooks from ``registry``'s plugins.

        Raises :class:`ConfigError` naming a hook that neither a plugin nor capd has.
        """
        config = loaded.config
        policy = config.policy
        loops = LoopPolicy(**policy.loops.model_dump())
        detector = self.policy.loops
        if detector.policy != loops:  # same thresholds: the counts carry over a reload
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
            consent=self.consent, loops=detector,
            before=[resolve(name, "before") for name in policy.before],
            after=[resolve(name, "after") for name in policy.after],
            hook_timeout_s=config.hook_timeout_s, hook_executor=self.user_executor,
            decisions=self.policy_decisions, recent=self.policy_recent)

    async def queue_stats(self, max_age_s: float = 1.0) -> QueueStats:
        """The queue's counts of its current jobs: read once, then refreshed in the
        background once older than ``max_age_s`` (a health request never waits on a
        count, however many jobs are kept).

        Raises the queue's error when it could not be read (health reports ``fail``).
        """
        age_s = (time.monotonic() - self._queue_stats[0] if self._queue_stats is not None
                 else math.inf)
        if age_s > max_age_s:
            refreshing = self._stats_refresh
            if refreshing is None or refreshing.done():
                refreshing = self._stats_refresh = self.spawn(self._read_queue_stats())
            if age_s > STATS_STALE_S:  # none recent (idle, or a read that hangs): wait for
                # this one, bounded (it times out itself): health never says pass on old counts
                await asyncio.shield(refreshing)
        assert self._queue_stats is not None
        value = self._queue_stats[1]
        if isinstance(value, str):  # a new exception each time: a kept one gathers frames
            raise RecoveryError(value)
        return value

    async def _read_queue_stats(self) -> None:
        assert self.queue is not None
        try:  # the current jobs only: an index read, however much history is kept
            async with asyncio.timeout(STATS_TIMEOUT_S):
                value: QueueStats | str = await self.queue.stats(retained=False)
        except RecoveryError as exc:
            value = str(exc)
        except TimeoutError:
            value = f"the queue did not answer its counts within {STATS_TIMEOUT_S:g}s"
        self._queue_stats = (time.monotonic(), value)

    def _reloaded(self, outcome: object) -> None:
        # notify-reload protocol: READY=1 ends the reload, whether it worked or not.
        self.notifier.notify("READY=1", f"STATUS={self.status_line()}")

    def status_line(self, queued: int | None = None) -> str:
        """The one-line status systemd shows: live, disabled and queued counts."""
        counts = self.registry.counts()
        text = f"{counts['live']} live, {counts['disabled']} disabled"
        return text if queued is None else f"{text}, {queued} queued"

    async def _report_status(self, interval_s: float = 2.0) -> None:
        last = ""
        while not self._stop.is_set():
            queued = None
            if self.queue is not None:
                try:
                    stats = await self.queue.stats()
                    queued = stats.by_state["pending"] + stats.by_state["leased"]
                except Exception as exc:  # the health check reports the queue; this only waits
                    log.debug("status_queue_unreadable", error=str(exc))
            line = self.status_line(queued)
            if line != last:
                self.notifier.status(line)
                last = line
            await self._stopped_within(interval_s)

    async def _watch_loop_lag(self) -> None:
        interval = self.lag_interval_s
        while not self._stop.is_set():
            before = time.monotonic()
            if not await self._stopped_within(interval):
                self.loop_lag_s = max(0.0, time.monotonic() - before - interval)

    async def _stopped_within(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if the daemon is told to stop; whether it was."""
        try:
            async with asyncio.timeout(seconds):
                await self._stop.wait()
        except TimeoutError:
            return False
        return True

    async def run(self) -> int:
        """Serve until stopped; return the process exit status.

        Raises :class:`CapdError` subclasses for start-up failures (a bad
        config, a broken plugin, a socket in use) before anything is bound.
        """
        config = self.loaded.config

        # Phase 1: one daemon per state directory (a second would sweep the same jobs),
        # then open the retry queue (refuses a damaged file or pragmas that did not take).
        state_dir = self.loaded.state_dir()
        lock = acquire_state_lock(state_dir)
        try:
            self.consent = ConsentStore.open(state_dir)  # refuses a damaged consent.json
            # The sweep is made next (_run_with_queue); an enqueue wakes it from then on.
            def wake() -> None:
                if self.sweep:
                    self.sweep.wake()

            if config.queue_url:  # a fleet's queue: serves even while the database is away
                self.queue = await PgRetryQueue.open(
                    config.queue_url, backoff=self.loaded.backoff(), on_enqueue=wake,
                    pool_size=config.queue_pool_size)
                log.info("queue_shared", database=self.queue.where)
            else:
                self.queue = await RetryQueue.open(
                    state_dir / "queue.db", synchronous=config.queue_synchronous,
                    reserve_bytes=config.queue_reserve_bytes, backoff=self.loaded.backoff(),
                    on_enqueue=wake)
            try:
                return await self._run_with_queue(self.queue)
            finally:
                await self.upstreams.close()  # a stdio server's process ends with its session
                await self.queue.close()
                tracing.shutdown_tracing()  # what is buffered goes out (3 s at most)
        finally:
            lock.release()

    async def _run_with_queue(self, queue: JobQueue) -> int:
        config = self.loaded.config
        loop = asyncio.get_running_loop()
        self.sweep = RetrySweep(queue, lambda: self.registry, self.rechecker,
                                batch=config.sweep_batch, grace_s=config.lease_grace_s,
                                executor=self.op_executor, verify_executor=self.user_executor,
                                running=self.running_attempts,
                                attempt_running_max_s=config.attempt_running_max_s,
                                vanished=self._vanished.get,
                                vanished_wait_s=config.recheck_interval_s)

        # Phase 2: build the registry (probes run concurrently). Its search index is
        # built once the daemon serves (phase 5): a search waits for it, a call does not.
        registry = await build(self.loaded.build_config(), executor=self.user_executor,
                               upstreams=self.upstreams)
        registry = self._with_agents(registry, self.loaded)
        self.policy = self._make_policy(self.loaded, registry)
        self.registry = registry
        counts = self.registry.snapshot().counts
        log.info("registry_built", queue=queue.where, **counts)

        # Phase 3: take the socket systemd handed over, or bind our own (refusing if
        # another daemon answers there).
        sock = inherited_socket()
        inode = None
        if sock is not None:
            self.inherited_socket = True
            name = sock.getsockname()
            if isinstance(name, str) and name:
                self.socket_path = Path(name)
            log.info("socket_inherited", socket=str(self.socket_path))
        else:
            sock = bind_unix_socket(self.socket_path)
            inode = socket_inode(self.socket_path)

        # Phase 4: serve.
        api = Api(
            self, max_body_bytes=config.max_body_bytes,
            limiter=RateLimiter(config.call_rate_per_s, config.call_burst), runs=self.runs,
        )
        # Keep descriptors in reserve for the queue, probes and subprocesses: when the
        # limit cannot be raised far enough, fewer connections are admitted instead.
        door = config.mcp.http
        door_wanted = door.max_connections + DOOR_ACCEPT_SLACK if door is not None else 0
        fd_limit = raise_fd_limit(config.max_connections + door_wanted + FD_RESERVE)
        max_connections = max(16, min(config.max_connections, fd_limit - FD_RESERVE))
        if max_connections < config.max_connections:
            log.warning("fd_limit_low", limit=fd_limit, max_connections=max_connections,
                        configured=config.max_connections,
                        hint="raise LimitNOFILE= (or ulimit -n) above max_connections + 256")
        server = HttpServer(api.hooks(), request_timeout_s=config.request_timeout_s,
                            max_connections=max_connections,
                            max_buffered_bytes=config.max_buffered_bytes)
        # the front door gets what the socket leaves: never the socket's descriptors
        self.front_doors = self._front_doors(api, max(
            16, fd_limit - FD_RESERVE - max_connections - DOOR_ACCEPT_SLACK))
        await self._switch_front_door(config.mcp.http)
        self.http = server
        await server.start(sock)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: self.spawn(self.reloader.reload()))

        # Phase 5: ready. Objects made during start-up live for the whole run:
        # move them out of the collector's way so full collections stay cheap.
        gc.freeze()
        self.state = "ready"
        self.notifier.ready(self.status_line())
        log.info("ready", socket=str(self.socket_path), pid=self.pid, version=self.version,
                 **counts)
        # the search index (capsule vectors cached in the state dir), in a thread
        self._build_search_soon(registry)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.rechecker.run(
                    config.recheck_interval_s, self._stop,
                    live_every_s=config.probe_live_interval_s,
                ))
                tg.create_task(self._watch_loop_lag())
                if isinstance(queue, RetryQueue):  # a database checkpoints itself
                    tg.create_task(self._checkpoint_when_idle(queue))
                tg.create_task(self._expire_finished_jobs(queue, config.queue_retention_s))
                sweep_task = tg.create_task(self.sweep.run(self._stop))
                assert self.front_doors is not None
                # the front door stays up while calls drain: it stops with the socket
                tg.create_task(self.front_doors.run(self._drained))
                if self.notifier.enabled:
                    tg.create_task(self._report_status())
                    watchdog = watchdog_interval_s()
                    if watchdog is not None:
                        tg.create_task(run_watchdog(self.notifier, watchdog, self._stop))
                await self._stop.wait()
                await self._drain(server, config.drain_grace_s, sweep_task)
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            if inode is not None:  # never unlink a socket systemd handed us
                remove_socket(self.socket_path, inode)
            self.runs.close()
            self.notifier.close()
        self.state = "stopped"
        log.info("stopped")
        return 0

    checkpoint_every_s = 5.0
    """How often an idle queue's write-ahead log is folded back and emptied."""

    async def _expire_finished_jobs(self, queue: JobQueue, retention_s: float) -> None:
        """Remove done and cancelled jobs past ``retention_s``, at start and then every
        ``EXPIRE_EVERY_S`` (half the retention when that is shorter): the queue stays the
        size of what is current. A pass that fails (a full disk, the database away) is
        logged and tried again next time."""
        every_s = min(EXPIRE_EVERY_S, max(0.5, retention_s / 2))
        while True:
            try:
                removed = await queue.expire_finished(retention_s)
            except RecoveryError as exc:
                log.warning("queue_expire_failed", error=str(exc))
            else:
                if removed:
                    log.info("queue_expired", removed=removed, retention_s=retention_s)
            if await self._stopped_within(every_s):
                return

    async def _checkpoint_when_idle(self, queue: RetryQueue) -> None:
        """Empty the queue's WAL (a TRUNCATE checkpoint) once no group commit has run for a
        while: SQLite's own PASSIVE checkpoints after batches fold it back but keep the
        file's size, and a WAL that only grows takes the room the sweep needs."""
        wal = queue.path.with_name(queue.path.name + "-wal")
        while not await self._stopped_within(self.checkpoint_every_s):
            try:
                size = wal.stat().st_size
            except OSError:
                continue
            if size and queue.idle_s >= self.checkpoint_every_s:
                await queue.checkpoint("TRUNCATE")

    def _front_doors(self, api: Api, max_connections: int) -> FrontDoors:
        """The MCP front door over HTTP (``[mcp.http]``), switched at start and at every
        reload, at most ``max_connections`` open (what the descriptors allow)."""
        from ._mcp_http import FrontDoor, FrontDoors

        wanted = self.loaded.config.mcp.http
        if wanted is not None and max_connections < wanted.max_connections:
            log.warning("fd_limit_low", limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                        mcp_http_max_connections=max_connections,
                        configured=wanted.max_connections,
                        hint="raise LimitNOFILE= (or ulimit -n) for [mcp.http] max_connections")
        return FrontDoors(lambda settings: FrontDoor(
            api, self.tokens, lambda: settings, lambda: self.policy.authority), max_connections)

    async def _switch_front_door(self, settings: McpHttpConfig | None) -> None:
        """Serve ``settings``' front door; raise :class:`ListenFailed` when its address
        cannot be had (the door serving before keeps serving)."""
        if self.front_doors is None:
            return
        try:
            await self.front_doors.switch(settings)
        except OSError as exc:
            raise ListenFailed(f"{exc.strerror}; free the port or change [mcp.http] listen "
                               "in capd.toml") from exc

    async def _drain(self, server: HttpServer, grace_s: float,
                     sweep: asyncio.Task[None]) -> None:
        # 1. Refuse new calls; /health and /readyz now answer 503.
        self.notifier.stopping()
        self.state = "draining"
        self.gateway.draining = True
        log.info("draining", in_flight=self.gateway.in_flight, grace_s=grace_s)
        # 2. Let in-flight calls finish within the grace period.
        try:
            async with asyncio.timeout(grace_s):
                await self.gateway.wait_idle()
        except TimeoutError:
            log.warning("drain_timeout", in_flight=self.gateway.in_flight)
        # 3. Close the listeners and connections (responses being written get a moment):
        #    the socket's, and the HTTP front door's (FrontDoors.run waits for this).
        self._drained.set()
        await server.close(grace_s=2.0)
        # 4. The sweep finishes the job it is on within the grace period, or is
        #    cancelled: that job's lease then expires at the next start, as after a crash.
        _, pending = await asyncio.wait({sweep}, timeout=grace_s)
        if pending:
            log.warning("sweep_cancelled_at_shutdown", busy=self.sweep.busy if self.sweep else 0)
            sweep.cancel()
        # 5. Stop background work (reloads, follow-ups).
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(self._background, timeout=2.0)
        # 6. Op threads still running past the grace period are abandoned, not awaited.
        self.op_executor.shutdown(wait=False, cancel_futures=True)
        self.user_executor.shutdown(wait=False, cancel_futures=True)


HOST_BOUND_EFFECTS = frozenset({"file_contains", "file_exists"})
"""Effects only the host that made the write can check: a local file. An http, command or
op effect is checked from wherever the job is replayed."""


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


def run_daemon(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` under uvloop when available (the daemon; ``capd check``'s build)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)
    return uvloop.run(coro)
