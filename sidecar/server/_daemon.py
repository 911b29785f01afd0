"""The daemon: a script of owned parts over one serving :class:`Generation`.

Start-up enters the parts in order, each on one ``AsyncExitStack``: the state lock →
the retry queue → the upstream pool → the serving generation → the socket server →
the HTTP front door → the background tasks; then ready. A part is cleaned up if and
only if it started, in the reverse order. Shutdown first drains (new calls refused
with 503, in-flight calls given the grace period, the socket and the front door still
up), then leaves the stack: the background tasks stop (the sweep finishes its job),
the front door and the socket close, the queue closes, the lock is released.

What serves is one value, :attr:`Daemon.generation` (configuration, registry, policy),
built by :func:`build_generation` at start-up and at every reload and replaced by one
assignment; everything that serves reads it when it needs it.

No code a user wrote runs on the event loop unless it is a coroutine: plain ops run on
``op_executor``; plain probes, effect verifiers and before-hooks on ``user_executor``;
each under its own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import signal
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import structlog

from capd.recovery import (
    JobQueue,
    QueueStats,
    Rechecker,
    RetryQueue,
    RetrySweep,
    RunningAttempts,
    tracing,
)
from capd.registry import (
    OpThreads,
    Registry,
    UpstreamError,
    UpstreamPool,
    refresh_upstream,
    run_probe,
)

if TYPE_CHECKING:

    from ._config import McpHttpConfig
    from ._mcp_http import FrontDoors

from .._errors import ListenFailed
from .._paths import capd_version, default_socket_path
from ._agents import BridgeLaunch, capd_command, claude_config, resolve_agent
from ._api import Api
from ._config import LoadedConfig, load_config
from ._consent import ConsentStore
from ._engines import bridge_config
from ._gateway import Gateway
from ._generation import Builder, Generation, build_generation
from ._http import HttpServer
from ._metrics import Metrics
from ._peers import RateLimiter
from ._policy import RECENT, Policy
from ._queueing import (
    QueueCounts,
    QueueSink,
    checkpoint_when_idle,
    expire_finished_jobs,
    open_queue,
    stopped_within,
)
from ._reload import Reloader
from ._runs import EngineRuns
from ._search import SearchIndexes
from ._socket import connection_caps, serve_unix_socket
from ._statelock import acquire_state_lock
from ._streams import Streams
from ._systemd import Notifier, report_status, run_watchdog, watchdog_interval_s
from ._tokens import TokenStore

LIST_CHANGED_SETTLE_S = 0.5
"""How long a server's notifications/tools/list_changed settle into one reload."""

log = structlog.get_logger("capd.daemon")

T = TypeVar("T")
State = Literal["starting", "ready", "draining", "stopped"]


class Daemon:
    """One capd process. Build it, then ``await run()``; ``request_stop()`` ends it."""

    stall_threshold_s = 5.0
    lag_interval_s = 0.5

    def __init__(self, loaded: LoadedConfig, *, socket_path: Path | None = None) -> None:
        config = loaded.config
        self.socket_path = socket_path or (
            loaded.resolve(config.socket) if config.socket else default_socket_path())
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
        # The policy's decision counts and latest refusals outlive every generation.
        self._decisions: Counter[tuple[str, str]] = Counter()
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.generation = Generation.empty(loaded, self._decisions, self._recent)
        self._builder: Builder | None = None  # made once the state directory is locked
        # Plain (sync) ops run here, not on asyncio's default executor, whose threads the
        # loop waits for at close: a hung op must not hold a stopping daemon.
        self.op_executor = OpThreads(max_workers=32, thread_name_prefix="capd-op")
        # Plain probes, verifiers and hooks: apart from ops, so hung ops cannot starve probes.
        self.user_executor = ThreadPoolExecutor(max_workers=config.user_code_threads,
                                                thread_name_prefix="capd-user")
        # One client session per upstream MCP server, kept across reloads; a server's
        # tools/list_changed refreshes that server's capabilities.
        self.upstreams = UpstreamPool(on_tools_changed=self._upstream_tools_changed)
        self.streams = Streams()  # the streamed calls running now (their questions)
        # Bearer tokens of the MCP front door over HTTP (hashed, in the state directory).
        self.tokens = TokenStore(loaded.state_dir() / "tokens.json")
        self._tools_changed: set[str] = set()  # servers whose burst of changes is settling
        self._vanished: dict[str, float] = {}  # capability -> when a reload took it away
        self.rechecker = Rechecker(
            lambda: self.generation.registry, cooldown_s=config.recheck_cooldown_s,
            probe=partial(run_probe, executor=self.user_executor, upstreams=self.upstreams))
        self.running_attempts = RunningAttempts()
        self.queue: JobQueue | None = None  # opened by run(); the sink answers NOT queued before
        self.sweep: RetrySweep | None = None
        self.metrics = Metrics(self)
        self.gateway = Gateway(lambda: self.generation.registry, self.rechecker,
                               policy=lambda: self.generation.policy,
                               executor=self.op_executor, hook_executor=self.user_executor,
                               hook_timeout_s=config.hook_timeout_s,
                               failure_sink=QueueSink(lambda: self.queue, self.running_attempts,
                                                      verify_grace_s=config.verify_grace_s),
                               observe=self.metrics.observe_call)
        self.notifier = Notifier()
        self.reloader = Reloader(self._rebuild, self._swap, spawn=self.spawn,
                                 on_start=self.notifier.reloading, on_end=self._reloaded)
        self._counts = QueueCounts(lambda: self.queue, self.spawn)
        self.search = SearchIndexes(lambda: self.generation.registry,
                                    lambda: self.loaded.state_dir() / "search", self.spawn,
                                    lambda: self.gateway.stats.by_status)
        self.front_doors: FrontDoors | None = None  # made at start, switched at each reload
        # agents' engine runs: each held to its agent's grant, all its processes killed
        self.runs = EngineRuns()

    # -- what serves now ---------------------------------------------------------------

    @property
    def loaded(self) -> LoadedConfig:
        """The configuration serving now."""
        return self.generation.loaded

    @property
    def registry(self) -> Registry:
        """The registry serving now."""
        return self.generation.registry

    @property
    def policy(self) -> Policy:
        """The policy serving now."""
        return self.generation.policy

    @property
    def front_door(self) -> dict[str, Any] | None:
        """The HTTP front door serving now, as ``capd status`` shows it (None: none)."""
        return self.front_doors.view() if self.front_doors is not None else None

    @property
    def uptime_s(self) -> float:
        """Seconds since the daemon object was made."""
        return time.monotonic() - self._started

    async def queue_stats(self, max_age_s: float = 1.0) -> QueueStats:
        """The queue's counts, never waited on for long (:meth:`QueueCounts.read`)."""
        return await self._counts.read(max_age_s)

    def status_line(self, queued: int | None = None) -> str:
        """The one-line status systemd shows: live, disabled and queued counts."""
        counts = self.generation.counts()
        text = f"{counts['live']} live, {counts['disabled']} disabled"
        return text if queued is None else f"{text}, {queued} queued"

    # -- owned tasks -------------------------------------------------------------------

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

    # -- start-up, serving, shutdown ---------------------------------------------------

    async def run(self) -> int:
        """Serve until stopped; return the process exit status.

        Raises :class:`CapdError` subclasses for start-up failures (a bad config, a
        broken plugin, a socket in use); the parts started by then are cleaned up.
        """
        config = self.loaded.config
        state_dir = self.loaded.state_dir()
        async with contextlib.AsyncExitStack() as parts:
            # 1. One daemon per state directory (a second would sweep the same jobs).
            parts.callback(acquire_state_lock(state_dir).release)
            parts.callback(tracing.shutdown_tracing)  # what is buffered goes out (3 s at most)
            parts.callback(self.notifier.close)
            consent = ConsentStore.open(state_dir)  # refuses a damaged consent.json
            # 2. The retry queue (refuses a damaged file or pragmas that did not take).
            queue = self.queue = await parts.enter_async_context(
                open_queue(self.loaded, self._wake_sweep))
            # 3. The upstream pool: a stdio server's process ends with its session.
            parts.push_async_callback(self.upstreams.close)
            # 4. The serving generation (probes run concurrently); user code's threads
            #    and engine runs are abandoned with it, never awaited.
            parts.callback(self._abandon_user_code)
            self._builder = Builder(self.user_executor, self.upstreams, self.runs,
                                    self._agent_config, consent, self._decisions, self._recent)
            self.generation = await build_generation(self._builder, self.loaded, None)
            log.info("registry_built", queue=queue.where, **self.generation.counts())
            # 5. The socket server: systemd's socket, or our own (refusing if another
            #    daemon answers there).
            api = Api(self, max_body_bytes=config.max_body_bytes,
                      limiter=RateLimiter(config.call_rate_per_s, config.call_burst),
                      runs=self.runs)
            door = config.mcp.http
            on_socket, on_door = connection_caps(
                config.max_connections, door.max_connections if door is not None else None)
            server = HttpServer(api.hooks(), request_timeout_s=config.request_timeout_s,
                                max_connections=on_socket,
                                max_buffered_bytes=config.max_buffered_bytes)
            self.socket_path = await parts.enter_async_context(
                serve_unix_socket(self.socket_path, server))
            # 6. The HTTP front door (switched again at every reload).
            await parts.enter_async_context(self._front_door(api, on_door))
            # 7. The background tasks, and the signals that stop or reload the daemon.
            await parts.enter_async_context(self._background_tasks(queue))
            self._ready()
            await self._stop.wait()
            await self._drain(config.drain_grace_s)
        self.state = "stopped"
        log.info("stopped")
        return 0

    def _ready(self) -> None:
        # Objects made during start-up live for the whole run: move them out of the
        # collector's way so full collections stay cheap.
        gc.freeze()
        self.state = "ready"
        self.notifier.ready(self.status_line())
        log.info("ready", socket=str(self.socket_path), pid=self.pid, version=self.version,
                 **self.generation.counts())
        # the search index (capsule vectors cached in the state dir), in a thread
        self.search.build_soon(self.generation.registry)

    def _wake_sweep(self) -> None:
        if self.sweep is not None:  # an enqueue before the sweep exists waits for its start
            self.sweep.wake()

    def _abandon_user_code(self) -> None:
        self.runs.close()
        # Op threads still running past the grace period are abandoned, not awaited.
        self.op_executor.shutdown(wait=False, cancel_futures=True)
        self.user_executor.shutdown(wait=False, cancel_futures=True)

    @contextlib.asynccontextmanager
    async def _front_door(self, api: Api, max_connections: int) -> AsyncIterator[None]:
        """The MCP front door over HTTP (``[mcp.http]``), at most ``max_connections`` open;
        it stays up while calls drain and closes before the socket does."""
        from ._mcp_http import FrontDoor, FrontDoors

        self.front_doors = FrontDoors(lambda settings: FrontDoor(
            api, self.tokens, lambda: settings, lambda: self.policy.authority), max_connections)
        try:
            await self._switch_front_door(self.loaded.config.mcp.http)
            yield
        finally:
            await self.front_doors.close()

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

    @contextlib.asynccontextmanager
    async def _background_tasks(self, queue: JobQueue) -> AsyncIterator[None]:
        """The loops that run while the daemon serves, and the signals. On leaving, the
        sweep finishes the job it is on within the grace period (or is cancelled: that
        job's lease then expires at the next start, as after a crash), the other loops
        end with the stop event, and owned tasks (reloads, follow-ups) are cancelled."""
        config = self.loaded.config
        stop = self._stop
        self.sweep = RetrySweep(queue, lambda: self.generation.registry, self.rechecker,
                                batch=config.sweep_batch, grace_s=config.lease_grace_s,
                                executor=self.op_executor, verify_executor=self.user_executor,
                                running=self.running_attempts,
                                attempt_running_max_s=config.attempt_running_max_s,
                                vanished=self._vanished.get,
                                vanished_wait_s=config.recheck_interval_s)
        loop = asyncio.get_running_loop()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.rechecker.run(config.recheck_interval_s, stop,
                                              live_every_s=config.probe_live_interval_s))
            tg.create_task(self._watch_loop_lag())
            if isinstance(queue, RetryQueue):  # a database checkpoints itself
                tg.create_task(checkpoint_when_idle(queue, stop))
            tg.create_task(expire_finished_jobs(queue, config.queue_retention_s, stop))
            sweep = tg.create_task(self.sweep.run(stop))
            if self.notifier.enabled:
                tg.create_task(report_status(self.notifier, self.status_line, self._counts.waiting,
                                             stop))
                watchdog = watchdog_interval_s()
                if watchdog is not None:
                    tg.create_task(run_watchdog(self.notifier, watchdog, stop))
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.request_stop)
            loop.add_signal_handler(signal.SIGHUP, lambda: self.spawn(self.reloader.reload()))
            try:
                yield
            finally:
                for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(signum)
                _, pending = await asyncio.wait({sweep}, timeout=config.drain_grace_s)
                if pending:
                    log.warning("sweep_cancelled_at_shutdown", busy=self.sweep.busy)
                    sweep.cancel()
                for task in list(self._background):
                    task.cancel()
                if self._background:
                    await asyncio.wait(self._background, timeout=2.0)

    async def _drain(self, grace_s: float) -> None:
        """Refuse new calls (/health and /readyz answer 503) and let in-flight calls finish
        within ``grace_s``; the socket and the front door still serve meanwhile."""
        self.notifier.stopping()
        self.state = "draining"
        self.gateway.draining = True
        log.info("draining", in_flight=self.gateway.in_flight, grace_s=grace_s)
        try:
            async with asyncio.timeout(grace_s):
                await self.gateway.wait_idle()
        except TimeoutError:
            log.warning("drain_timeout", in_flight=self.gateway.in_flight)

    async def _watch_loop_lag(self) -> None:
        interval = self.lag_interval_s
        while not self._stop.is_set():
            before = time.monotonic()
            if not await stopped_within(self._stop, interval):
                self.loop_lag_s = max(0.0, time.monotonic() - before - interval)

    # -- reload ------------------------------------------------------------------------

    async def _rebuild(self) -> Generation:
        assert self._builder is not None, "a reload runs only once the daemon has started"
        loaded = await asyncio.to_thread(load_config, self.loaded.path)
        generation = await build_generation(self._builder, loaded, self.generation)
        # Last: a new address or certificate that cannot be had fails the reload, the old
        # door serving.
        await self._switch_front_door(loaded.config.mcp.http)
        return generation

    def _swap(self, generation: Generation) -> None:
        # capabilities a reload took away (their queued jobs wait for them, not parked)
        old = self.generation.registry.snapshot()
        registry = generation.registry
        gone = {name for name in (*old.live, *old.disabled) if name not in registry}
        for name in [n for n in self._vanished if n in registry]:
            del self._vanished[name]  # back: its jobs run again
        self._vanished.update(dict.fromkeys(gone, time.time()))
        self.generation = generation
        self.rechecker.cooldown_s = generation.loaded.config.recheck_cooldown_s

    def _reloaded(self, outcome: object) -> None:
        # notify-reload protocol: READY=1 ends the reload, whether it worked or not.
        self.notifier.notify("READY=1", f"STATUS={self.status_line()}")

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
            base = self.generation
            if not base.registry.has_tool(tool):
                return
            started = time.monotonic()
            try:
                registry = await refresh_upstream(base.registry, tool, self.upstreams)
            except UpstreamError as exc:  # its probe marks it down; the old list stays
                log.warning("upstream_refresh_failed", tool=tool, error=str(exc))
                return
            except ValueError as exc:
                log.warning("upstream_refresh_clash", tool=tool, error=str(exc))
                await self.reloader.reload()
                return
            await asyncio.to_thread(registry.prepare_search, base.loaded.state_dir() / "search")
            if self.generation is base and not self.reloader.running:
                # the configuration and the policy stay as they are
                self.generation = dataclasses.replace(base, registry=registry)
                log.info("upstream_refreshed", tool=tool, capabilities=len(registry),
                         duration_s=round(time.monotonic() - started, 4))
                return

    def _agent_config(self, name: str, context: Mapping[str, str]) -> dict[str, Any]:
        """The MCP configuration agent ``name`` runs with in ``context``: the capd bridge
        held to what it resolves to now."""
        resolution = resolve_agent(
            name, agents=self.loaded.agents, injections=self.loaded.injections,
            registry=self.registry, context=context,
            bridge=BridgeLaunch(capd_command(), self.socket_path))
        return bridge_config(claude_config(resolution))


def run_daemon(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` under uvloop when available (the daemon; ``capd check``'s build)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)
    return uvloop.run(coro)
