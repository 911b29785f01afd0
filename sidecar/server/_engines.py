"""Agents that run: an ``[agents.NAME]`` with an ``engine`` is also the capability ``agent.NAME``.

Invoking it with ``{goal, context?, cwd?}`` runs the engine (any agent CLI, a local
model runner, a script; its argv as declared) in a process group of its own:

- stdin: one JSON object, ``{"goal", "context", "cwd", "system_prompt", "agent"}``;
- ``CAPD_MCP_CONFIG``: the path of its MCP configuration (``{"mcpServers": {...}}``,
  what ``capd agent resolve NAME --format claude`` answers, with the run's context): the
  capd bridge held to exactly the agent's capabilities, so the engine's own tool calls
  go through capd under the agent's grant (policy, loops, consent and the retry queue
  apply to them); ``CAPD_AGENT``: its name;
- stdout: its answer, one JSON value (at most :data:`MAX_OUTPUT` bytes): the result;
- exit status: 0 is success; 75 (``EX_TEMPFAIL``) a transient failure; anything else a
  permanent one, with the last lines of stderr;
- past the capability's ``timeout_s`` (the agent's, 60 s unless declared) the process
  group is killed (SIGKILL) and the call is a transient timeout: nothing is left running.

An agent's capability mutates state (an agent may do anything its capabilities do) and is
never replayed by the retry queue on its own (``manual``). Its manifest shows the agent:
system prompt, engine, and the capabilities and servers it resolves to now.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from capd.registry import (
    AgentSpec,
    Capability,
    PermanentToolError,
    Registry,
    TransientToolError,
)

from ._grant import Grant, Profile
from ._runs import EngineRuns

AGENT_PREFIX = "agent."
SOURCE = "capd:agents"
MAX_OUTPUT = 1 << 20
STDERR_TAIL = 2048
EX_TEMPFAIL = 75
AFTER_EXIT_S = 1.0
"""How long the output may still come after the engine exits (a child holding it)."""
ENGINE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "TZ", "TMPDIR",
              "XDG_RUNTIME_DIR")
"""The daemon's environment variables an engine gets (no secret of the daemon's)."""


def _inherited_env() -> dict[str, str]:
    return {key: os.environ[key] for key in ENGINE_ENV if key in os.environ}


class AgentTask(BaseModel):
    """What an agent is asked to do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    goal: str = Field(min_length=1, description="What the agent is to achieve, in words.")
    context: dict[str, Any] | None = Field(
        None, description="What it should know: facts, ids, prior results (a JSON object), "
        "handed to the engine as it is. It selects no injections and fills none of the "
        "agent's servers: what the agent may use is the operator's to declare.")
    cwd: str | None = Field(None, description="The directory it works in (must exist); "
                            "the daemon's own when left out.")


ConfigFor = Callable[[str, Mapping[str, str]], dict[str, Any]]
"""The MCP configuration of agent NAME in a context (raises when it does not resolve)."""


def agent_grant(name: str, spec: AgentSpec) -> Grant:
    """What agent ``name``'s engine, and every process it starts, may reach on the
    socket: exactly the agent's declared capabilities (names, globs, ``tag:`` entries)."""
    names = tuple(e for e in spec.capabilities if not e.startswith("tag:"))
    tags = tuple(e.removeprefix("tag:") for e in spec.capabilities if e.startswith("tag:"))
    return Grant("agent", Profile(f"engine.{name}", names, tags), bound=True)


def run_as_ids(spec: AgentSpec) -> tuple[int | None, int | None]:
    """The uid and gid ``run_as`` names when the daemon is root (None, None otherwise).

    Raises ``ValueError`` naming a user this host does not have."""
    if spec.run_as is None or os.geteuid() != 0:
        return None, None
    import pwd

    try:
        entry = (pwd.getpwuid(int(spec.run_as)) if spec.run_as.isdigit()
                 else pwd.getpwnam(spec.run_as))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"run_as {spec.run_as!r}: no such user on this host (create it, "
                         "e.g. the units' sysusers.d capd-agent)") from exc
    return entry.pw_uid, entry.pw_gid


def agent_capabilities(agents: Mapping[str, AgentSpec], config_for: ConfigFor,
                       runs: EngineRuns | None = None) -> list[Capability]:
    """One capability for each agent that declares an engine (its runs tracked by
    ``runs``: held to the agent's grant, every process killed at the end).

    Raises ``ValueError`` for a ``run_as`` user this host does not have."""
    out = []
    for name, spec in sorted(agents.items()):
        if spec.engine is None:
            continue
        summary = spec.description or f"Run the {name} agent on a goal."
        out.append(Capability(
            name=f"{AGENT_PREFIX}{name}", summary=summary,
            description=(f"{summary} Runs {spec.engine[0]} with the goal; its own tool calls "
                         "go through capd with the agent's capabilities."),
            parameters=AgentTask, func=_runner(name, spec, config_for, runs or EngineRuns(
                use_cgroups=False)),
            mutates_state=True, safety="external_side_effects", retry_policy="manual",
            tags=("agent",), timeout_s=spec.timeout_s, latency_class=spec.latency_class,
            agent={"name": name, "engine": list(spec.engine),
                   "system_prompt": spec.system_prompt,
                   "capabilities": list(spec.capabilities)},
            op_id=f"agent:{name}", source=SOURCE))
    return out


def with_agents(registry: Registry, agents: Mapping[str, AgentSpec], config_for: ConfigFor,
                runs: EngineRuns | None = None) -> Registry:
    """``registry`` with the agents' capabilities (a clash with a declared name, or a
    ``run_as`` user the host lacks, is a ``ValueError``)."""
    return registry.with_source(SOURCE, agent_capabilities(agents, config_for, runs), {})


def _runner(name: str, spec: AgentSpec, config_for: ConfigFor, runs: EngineRuns
            ) -> Callable[..., Any]:
    uid, gid = run_as_ids(spec)  # checked when the registry is built: an unknown user fails it
    grant = agent_grant(name, spec)

    async def run(params: AgentTask) -> Any:
        # The caller's context goes to the engine in its request, never into the agent's
        # resolution: a caller must not select injections or fill the agent's server args.
        try:
            config = config_for(name, {})
        except Exception as exc:  # an agent that does not resolve cannot run
            raise PermanentToolError(f"agent {name} cannot be resolved: {exc}") from exc
        cwd = params.cwd
        if cwd is not None and not await asyncio.to_thread(os.path.isdir, cwd):
            raise PermanentToolError(f"cwd {cwd!r} is not a directory")
        request = {"goal": params.goal, "context": params.context, "cwd": cwd,
                   "system_prompt": spec.system_prompt, "agent": name}
        assert spec.engine is not None
        return await run_engine(spec.engine, request, config, cwd=cwd, agent=name,
                                runs=runs, grant=grant, uid=uid, gid=gid)

    run.__name__ = f"agent_{name}"
    return run


async def run_engine(argv: tuple[str, ...], request: dict[str, Any], config: dict[str, Any],
                     *, cwd: str | None, agent: str, runs: EngineRuns, grant: Grant,
                     uid: int | None = None, gid: int | None = None) -> Any:
    """Run one engine on ``request`` with its MCP ``config``; its JSON answer. The engine
    and everything it starts are one run of ``runs`` (held to ``grant`` on the socket,
    all killed when the run ends), as ``uid``/``gid`` when given."""
    run = runs.start(agent, grant)
    try:
        with tempfile.TemporaryDirectory(prefix="capd-agent-") as folder:
            config_path = Path(folder) / "mcp.json"
            config_path.write_text(json.dumps(config))
            if uid is not None:  # the engine's user reads its configuration
                for path in (folder, config_path):
                    os.chown(path, uid, -1 if gid is None else gid)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *runs.launcher(run, argv, uid, gid), stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd,
                    start_new_session=True,
                    env={**_inherited_env(), "CAPD_MCP_CONFIG": str(config_path),
                         "CAPD_AGENT": agent, **runs.environment(run)})
            except OSError as exc:
                raise PermanentToolError(f"agent {agent}: its engine {argv[0]!r} cannot "
                                         f"start: {exc.strerror or exc}") from exc
            runs.attach(run, proc.pid)
            try:
                return await _talk(proc, request, agent)
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                if proc.returncode is None:
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(proc.wait())
    finally:
        # answered, failed, cancelled (its timeout) or never started: nothing of the run
        # stays running, whatever session or group it moved to, and the run is forgotten
        await asyncio.shield(runs.finish(run))


async def _talk(proc: asyncio.subprocess.Process, request: dict[str, Any], agent: str) -> Any:
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    assert stdin is not None
    assert stdout is not None
    assert stderr is not None
    # an engine that answers without reading its request may be gone already: its answer
    # still counts (uvloop says a closed pipe with a RuntimeError, asyncio with BrokenPipe)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
        stdin.write(json.dumps(request).encode() + b"\n")
        await stdin.drain()
        stdin.close()
    tail = bytearray()

    async def keep_tail() -> None:
        while piece := await stderr.read(65536):
            tail.extend(piece)
            del tail[:-STDERR_TAIL]

    errors = asyncio.ensure_future(keep_tail())
    out = bytearray()

    async def read_out() -> None:
        while piece := await stdout.read(65536):
            out.extend(piece)
            if len(out) > MAX_OUTPUT:
                raise PermanentToolError(f"agent {agent} printed more than {MAX_OUTPUT} bytes; "
                                         "an engine answers one JSON value")

    reading = asyncio.ensure_future(read_out())
    try:
        await asyncio.wait([reading, asyncio.ensure_future(proc.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if reading.done():
            reading.result()  # over the limit: raised here
        code = await proc.wait()
        # a child it left behind may hold stdout open: the answer is what came by now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reading), AFTER_EXIT_S)
        if reading.done():
            reading.result()
    finally:
        reading.cancel()
        errors.cancel()
    said = tail.decode("utf-8", "replace").strip()
    if code == EX_TEMPFAIL:
        raise TransientToolError(f"agent {agent} failed for now (exit 75): {said[-500:]}")
    if code != 0:
        raise PermanentToolError(f"agent {agent} exited {code}: {said[-500:] or 'no stderr'}")
    try:
        return json.loads(out)
    except ValueError:
        raise PermanentToolError(f"agent {agent} answered no JSON on stdout: "
                                 f"{out[:200].decode('utf-8', 'replace')!r}") from None


def bridge_config(resolved: dict[str, Any]) -> dict[str, Any]:
    """A claude-format configuration whose capd bridges run as this interpreter's
    ``-m capd`` (the ``capd`` script need not be on the engine's PATH)."""
    servers = {}
    for server_name, server in resolved.get("mcpServers", {}).items():
        args = list(server.get("args", []))
        if args[:1] == ["mcp"]:
            server = {**server, "command": sys.executable, "args": ["-m", "capd", *args]}
        servers[server_name] = server
    return {"mcpServers": servers}
