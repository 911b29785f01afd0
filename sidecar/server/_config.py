"""capd.toml, read with pydantic-settings; every key overridable by ``CAPD_*`` variables.

Nested keys use ``__``: ``CAPD_VARS__VAULT=/srv/notes``. Relative paths in the
file are relative to the file's folder. ``{config_dir}``, ``{state_dir}`` and the
``[vars]`` table are substituted into tool specs, declaration options and seeds.

A misspelt key is caught either way: an unknown key in the file is an error that
suggests the closest known one; an unknown ``CAPD_*`` variable (which pydantic-settings
would silently ignore) is kept on :attr:`LoadedConfig.unknown_env`, with a suggestion,
for the caller to warn about.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from capd.recovery import BackoffPolicy, default_state_dir
from capd.registry import (
    AgentSpec,
    BuildConfig,
    ConfigError,
    DeclarationError,
    InjectionSpec,
    TemplateError,
    ToolSpec,
    TopologySet,
    describe_validation_error,
    load_topologies,
    parse_tool,
    render_vars,
)

ENV_PREFIX = "CAPD_"

# CAPD_* variables read by something other than the settings: the config path
# (sidecar/_paths.py) and the test suite's knobs (tests/test_crash.py, test_schema.py).
_ENV_READ_ELSEWHERE = frozenset({"CAPD_CONFIG", "CAPD_OUTPUT", "CAPD_CRASH_KILLS",
                                 "CAPD_UPDATE_GOLDEN"})

# An agent's name is a URL path segment (/agents/NAME) and part of an MCP server's name.
_AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


class SeedSpec(BaseModel):
    """A folder copied into place when it is missing, before the registry is first built."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="The folder to create; {vars} allowed.")
    source: str = Field(description="The folder it starts as a copy of; {vars} allowed.")


class LoopsConfig(BaseModel):
    """``[policy.loops]``: loop detection per agent session (see ``_loops.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    warn_at: int = Field(3, ge=2, description="Identical calls (or answers) that warn.")
    block_at: int = Field(5, ge=2, description="Identical calls (or answers) that block.")
    window_s: float = Field(60.0, gt=0, description="How far back calls count.")
    per_minute_warn: int = Field(60, ge=1, description="Calls to one capability a minute.")
    per_minute_block: int = Field(120, ge=1, description="... and the limit.")
    anonymous: bool = Field(False, description="Also check in-process callers that send "
                            "no session (a socket peer without one is counted by uid and pid).")
    require_session: bool = Field(False, description="Refuse a call that sends no "
                                  "Capd-Session header (error_blocked session_required).")
    applies_to: Literal["agents", "everyone"] = Field(
        "agents", description="Whose calls are counted: callers acting as agents (an "
        "agent's grant, a token, a narrowed bridge, an engine, or a Capd-Session), or "
        "everyone (the operator's own programs too).")

    @model_validator(mode="after")
    def _ordered(self) -> LoopsConfig:
        if self.block_at <= self.warn_at:
            raise ValueError(f"block_at ({self.block_at}) must be above warn_at "
                             f"({self.warn_at})")
        if self.per_minute_block <= self.per_minute_warn:
            raise ValueError(f"per_minute_block ({self.per_minute_block}) must be above "
                             f"per_minute_warn ({self.per_minute_warn})")
        return self


class SsrfConfig(BaseModel):
    """``[policy.ssrf]``: hosts, globs or networks the SSRF guard lets through."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[str] = Field(default_factory=list)


class PolicyConfig(BaseModel):
    """``[policy]``: hooks by name and order, loop detection, the SSRF guard's allowlist."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    before: list[str] = Field(default_factory=list, description="Before-call hooks, in order.")
    after: list[str] = Field(default_factory=list, description="After-call hooks, in order.")
    loops: LoopsConfig = Field(default_factory=LoopsConfig)
    ssrf: SsrfConfig = Field(default_factory=SsrfConfig)


_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


class McpHttpConfig(BaseModel):
    """``[mcp.http]``: MCP over streamable HTTP, served by the daemon, for bearer tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: str = Field("127.0.0.1:8765", description="host:port to listen on (loopback "
                        "unless TLS is configured or insecure_plaintext is true).")
    path: str = Field("/mcp", pattern=r"^/[A-Za-z0-9/_.-]*$")
    allowed_origins: list[str] = Field(
        default_factory=list, description="Origin values a browser-borne request may carry "
        "(\"http://localhost:*\" allows any port); any other Origin is refused with 403.")
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure_plaintext: bool = Field(False, description="Serve plain HTTP on an address "
                                     "that is not loopback (tokens then cross in the clear).")
    max_sessions: int = Field(1000, gt=0)
    session_idle_timeout_s: float = Field(1800.0, gt=0)
    max_connections: int = Field(1024, ge=16, description="Open connections at most; at "
                                 "the cap the one silent longest with nothing in flight "
                                 "is closed (fewer when the descriptor limit is low).")
    max_connections_per_peer: int = Field(512, ge=1, description="... from one address.")
    head_timeout_s: float = Field(10.0, gt=0, description="A request's head must come whole "
                                  "this soon after connecting, or after the last answer.")
    idle_timeout_s: float = Field(5.0, gt=0, description="A connection with nothing in "
                                  "flight is closed this long after its last answer.")

    @model_validator(mode="after")
    def _address(self) -> McpHttpConfig:
        host, colon, port = self.listen.rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"listen {self.listen!r}: give host:port, e.g. 127.0.0.1:8765")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if host not in _LOOPBACK_HOSTS and self.tls_cert is None and not self.insecure_plaintext:
            raise ValueError(f"listen {self.listen!r} is not a loopback address: set tls_cert "
                             "and tls_key, or insecure_plaintext = true to send tokens in the "
                             "clear")
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        """The address to bind."""
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class McpConfig(BaseModel):
    """``[mcp]``: what ``capd mcp`` offers an agent beyond the capabilities, and the MCP
    front door over HTTP (``[mcp.http]``, off unless the table is there)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operator_tools: list[Literal["reload", "recheck"]] = Field(
        default_factory=list,
        description="Operator commands offered as MCP tools too (off by default): reload "
        "(answers when the reload is done) and recheck (says what it restored).")
    http: McpHttpConfig | None = None
    tools: Literal["brief", "full"] = Field(
        "brief", description="The meta tools a front door lists: brief (search, get and "
        "invoke, terse: under 350 tokens) or full (every meta tool, every argument).")


class ProfileConfig(BaseModel):
    """``[profiles.NAME]``: the capabilities (name globs) and tags a bound caller may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capabilities: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)


class PeerConfig(BaseModel):
    """``[[peers]]``: callers (by uid or gid) bound to a profile and/or a channel."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | None = None
    uid: int | None = None
    gid: int | None = None
    channel: str | None = Field(None, min_length=1, max_length=64)

    @model_validator(mode="after")
    def _names_someone(self) -> PeerConfig:
        if self.uid is None and self.gid is None:
            raise ValueError("a [[peers]] entry names a uid or a gid")
        if self.profile is None and self.channel is None:
            raise ValueError("a [[peers]] entry binds its callers to a profile, a channel "
                             "or both")
        return self


class CapdConfig(BaseSettings):
    """The daemon's configuration. Unknown keys are an error naming the key."""

    model_config = SettingsConfigDict(
        env_prefix="CAPD_", extra="forbid", env_nested_delimiter="__", frozen=True
    )

    plugins: list[str] = Field(default_factory=list, description="Python modules holding ops.")
    plugin_paths: list[str] = Field(default_factory=list, description="Folders put on sys.path.")
    declarations: list[str] = Field(default_factory=list, description="TOML files or folders.")
    tools: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "Tools capabilities need, by id: kind (command, http, tcp, unix, path, python) "
        "and how to probe it."))
    vars: dict[str, str] = Field(default_factory=dict,
        description="Values substituted as {name} into tools, declaration options and seeds.")
    seed: list[SeedSpec] = Field(
        default_factory=list, description="Folders copied into place when missing, at start.")
    entry_points: bool = Field(
        True, description="Also load modules advertised under the capd.plugins entry point.")
    socket: str | None = Field(None, description=(
        "The Unix socket (default: /run/capd/capd.sock as root, else "
        "$XDG_RUNTIME_DIR/capd/capd.sock)."))
    state_dir: str | None = Field(None, description=(
        "Where the queue, consent and tokens live (default: /var/lib/capd as root, else "
        "$XDG_STATE_HOME/capd)."))
    recheck_cooldown_s: float = Field(30.0, ge=0,
        description="A tool is probed again on demand at most this often.")
    recheck_interval_s: float = Field(30.0, gt=0,
        description="Disabled capabilities' tools are re-probed in the background this often.")
    probe_live_interval_s: float | None = Field(
        60.0, gt=0, description="Re-probe live tools this often too; null turns it off."
    )
    drain_grace_s: float = Field(10.0, ge=0,
        description="At shutdown, calls in flight get this long to finish.")
    max_body_bytes: int = Field(1 << 20, ge=1024,
        description="The largest request body the socket takes (413 above).")
    queue_synchronous: Literal["FULL", "NORMAL"] = Field(
        "FULL", description="The queue file's synchronous pragma: FULL survives power loss.")
    queue_url: str | None = Field(
        None, description="postgresql://… : keep the retry queue in PostgreSQL, shared by "
        "every daemon given the same URL (a fleet); unset, it is the SQLite file in the state "
        "directory. Also CAPD_QUEUE_URL.")
    queue_pool_size: int = Field(
        16, ge=1, le=256, description="With queue_url: the connections each daemon keeps to "
        "the queue's database (concurrent writes beyond it wait for one).")
    queue_reserve_bytes: int | None = Field(
        None, ge=0, description="Free space kept on the queue's file system for finishing "
        "queued jobs: new jobs are refused below it (NOT queued: disk nearly full). Default: "
        "the larger of 16 MiB and 5 % of the file system.")
    retry_base_s: float = Field(1.0, gt=0,
        description="A queued write's first retry waits this long...")
    retry_factor: float = Field(2.0, ge=1,
        description="... each next one this many times longer...")
    retry_cap_s: float = Field(300.0, gt=0,
        description="... but never longer than this.")
    retry_max_attempts: int = Field(8, ge=1,
        description="Attempts a queued write may spend before it is dead (an outage spends none).")
    retry_max_age_s: float = Field(7 * 86400.0, gt=0,
        description="A queued write older than this is dead, whatever its attempts.")
    queue_retention_s: float = Field(
        7 * 86400.0, gt=0, description="How long done and cancelled jobs are kept (with "
        "their trails) before they are removed in the background.")
    lease_grace_s: float = Field(5.0, ge=0,
        description="A sweep's lease outlives the call's timeout by this much.")
    verify_grace_s: float = Field(2.0, ge=0,
        description="How long a declared effect may take to show before it is checked.")
    sweep_batch: int = Field(32, ge=1, le=1000,
        description="Due jobs the sweep claims at once.")
    health_pending_age_s: float = Field(600.0, gt=0,
        description="/health warns when the oldest pending job is older than this.")
    allow_uids: list[int] = Field(default_factory=list, description="Peers besides our uid.")
    allow_gids: list[int] = Field(default_factory=list, description="Peer groups allowed.")
    operator_uids: list[int] = Field(
        default_factory=list, description="Uids besides root and the daemon's own that may use "
        "the operator rows (queue, reload, status, metrics, consent, sessions...).")
    call_rate_per_s: float = Field(5000.0, ge=0, description="Per-peer /call rate; 0 = off.")
    call_burst: int = Field(10000, ge=1,
        description="... and the burst it allows.")
    request_timeout_s: float = Field(
        10.0, gt=0, description="A request's headers and body must arrive within this.")
    max_connections: int = Field(
        4096, ge=8, description="Open client connections at most; idle ones are evicted first.")
    max_buffered_bytes: int = Field(
        64 << 20, ge=1 << 20, description="Request bytes buffered across all connections.")
    attempt_running_max_s: float = Field(
        600.0, gt=0, description="An abandoned op thread still running after this parks its "
        "job for an operator.")
    hook_timeout_s: float = Field(5.0, gt=0, description="Each before-hook must answer within.")
    user_code_threads: int = Field(
        16, ge=1, le=256, description="Threads for plain probes, verifiers and hooks.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    profiles: dict[str, ProfileConfig] = Field(default_factory=dict, description=(
        "Named reaches ([profiles.NAME]): the capabilities and tags a peer, token or bridge "
        "is held to."))
    peers: list[PeerConfig] = Field(default_factory=list,
        description="Peers bound by uid or gid to a profile and a channel.")
    agents: dict[str, AgentSpec] = Field(
        default_factory=dict, description="[agents.NAME]: what each agent may use, explicitly.")
    injections: list[InjectionSpec] = Field(
        default_factory=list, description="[[injections]]: capabilities the context adds.")

    @model_validator(mode="after")
    def _agent_names(self) -> CapdConfig:
        for name in self.agents:
            if not _AGENT_NAME.match(name):
                raise ValueError(f"[agents.{name}]: an agent's name is a letter, then letters, "
                                 "digits, '_' or '-'")
        return self

    @model_validator(mode="after")
    def _peers_name_profiles(self) -> CapdConfig:
        for peer in self.peers:
            if peer.profile is not None and peer.profile not in self.profiles:
                known = ", ".join(sorted(self.profiles)) or "none declared"
                raise ValueError(f"[[peers]] binds to profile {peer.profile!r}, which is not "
                                 f"declared under [profiles] (profiles: {known})")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first: a CAPD_* variable overrides the file.
        return (env_settings, init_settings)


class UnknownVariable(NamedTuple):
    """A ``CAPD_*`` environment variable that names no setting, and the closest that does."""

    name: str
    suggestion: str | None

    def sentence(self) -> str:
        """``CAPD_X is not a capd setting and is ignored (did you mean CAPD_Y?)``."""
        hint = f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        return f"{self.name} is not a capd setting and is ignored{hint}"


class LoadedConfig:
    """A validated config plus where it came from."""

    def __init__(self, config: CapdConfig, path: Path | None,
                 unknown_env: tuple[UnknownVariable, ...] = ()) -> None:
        self.config = config
        self.path = path
        self.dir = path.parent.resolve() if path else Path.cwd()
        self.unknown_env = unknown_env

    def resolve(self, value: str) -> Path:
        """Resolve ``value`` against the config file's folder."""
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else self.dir / path

    @property
    def variables(self) -> dict[str, str]:
        """``config_dir``, ``state_dir`` and the ``[vars]`` table (whose values may use both)."""
        base = {"config_dir": str(self.dir), "state_dir": str(self.state_dir())}
        try:
            rendered = {k: render_vars(v, base) for k, v in self.config.vars.items()}
        except TemplateError as exc:
            raise ConfigError(f"vars: {exc}") from exc
        return {**base, **rendered}

    def tools(self) -> dict[str, ToolSpec]:
        """Validate the ``[tools]`` tables, variables substituted; raise :class:`ConfigError`."""
        variables = self.variables
        try:
            return {
                tool_id: parse_tool(tool_id, raw, self.label, variables)
                for tool_id, raw in self.config.tools.items()
            }
        except DeclarationError as exc:
            raise ConfigError(str(exc)) from exc

    @property
    def label(self) -> str:
        """The config file's name for messages."""
        return str(self.path) if self.path else "environment"

    def state_dir(self) -> Path:
        """Where the queue lives: ``state_dir`` from the config, else the default."""
        return self.resolve(self.config.state_dir) if self.config.state_dir else default_state_dir()

    def seed(self) -> list[Path]:
        """Copy each ``[[seed]]`` source to its path where the path is missing; return those made.

        An existing path is never touched, so this runs at every start. A copy is
        made under a scratch name and renamed into place: a start interrupted
        mid-copy leaves no half folder at the path. Raises :class:`ConfigError`
        when a source is not a folder or the copy fails.
        """
        made = []
        variables = self.variables
        for number, spec in enumerate(self.config.seed):
            try:
                path = self.resolve(render_vars(spec.path, variables))
                source = self.resolve(render_vars(spec.source, variables))
            except TemplateError as exc:
                raise ConfigError(f"{self.label}: seed {number}: {exc}") from exc
            if path.exists() or path.is_symlink():
                continue
            if not source.is_dir():
                raise ConfigError(f"{self.label}: seed {number}: {source} is not a folder "
                                  f"(it would be copied to {path}, which does not exist)")
            scratch = path.with_name(f".{path.name}.seed-{os.getpid()}")
            try:
                _private_folder(path.parent)
                shutil.copytree(source, scratch, symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
                _make_private(scratch)
                scratch.rename(path)
            except OSError as exc:
                shutil.rmtree(scratch, ignore_errors=True)
                raise ConfigError(f"{self.label}: seed {number}: cannot copy {source} to "
                                  f"{path}: {exc.strerror or exc}") from exc
            made.append(path)
        return made

    @property
    def agents(self) -> dict[str, AgentSpec]:
        """``[agents.NAME]`` by name."""
        return self.config.agents

    @property
    def injections(self) -> list[InjectionSpec]:
        """``[[injections]]``, in order."""
        return self.config.injections

    def topologies(self) -> TopologySet:
        """The ``[[topology]]`` tables of the declaration files, read now (blocking).

        Never raises: what cannot be read is an error of the set.
        """
        return load_topologies((self.resolve(p) for p in self.config.declarations),
                               label_root=self.dir)

    def backoff(self) -> BackoffPolicy:
        """The retry back-off from the config."""
        c = self.config
        return BackoffPolicy(down_wait_s=c.recheck_cooldown_s,
                             base_s=c.retry_base_s, factor=c.retry_factor, cap_s=c.retry_cap_s,
                             max_attempts=c.retry_max_attempts, max_age_s=c.retry_max_age_s)

    def build_config(self) -> BuildConfig:
        """Return what :func:`registry.build` needs, paths resolved."""
        return BuildConfig(
            plugins=tuple(self.config.plugins),
            plugin_paths=tuple(self.resolve(p) for p in self.config.plugin_paths),
            declarations=tuple(self.resolve(p) for p in self.config.declarations),
            tools=self.tools(),
            variables=self.variables,
            entry_points=self.config.entry_points,
            label_root=self.dir,
        )


def load_config(path: Path | None) -> LoadedConfig:
    """Read and validate ``path`` (or only the environment when None).

    Raises :class:`ConfigError` with one sentence naming the file and the key.
    """
    data: dict[str, Any] = {}
    label = str(path) if path else "environment"
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found; pass --config PATH") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    unknown = [key for key in data if key not in CapdConfig.model_fields]
    if unknown:
        raise ConfigError(f"{label}: " + "; ".join(
            f"{key}: unknown key{_did_you_mean(key, list(CapdConfig.model_fields))}"
            for key in unknown))
    try:
        config = CapdConfig(**data)
    except ValidationError as exc:
        text, _ = describe_validation_error(exc)
        raise ConfigError(f"{label}: {text.replace('unknown field', 'unknown key')}") from exc
    loaded = LoadedConfig(config, path, unknown_environment_variables(os.environ))
    loaded.tools()  # a broken tool spec is a config error, found now
    return loaded


def _did_you_mean(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_environment_variables(environ: Mapping[str, str]) -> tuple[UnknownVariable, ...]:
    """The ``CAPD_*`` names in ``environ`` that set no key, each with the closest known name.

    A name is known when it is ``CAPD_<KEY>`` or ``CAPD_<KEY>__<nested>`` for a key
    of :class:`CapdConfig` (matched without regard to case, as pydantic-settings
    does), or one read elsewhere (``CAPD_CONFIG``).
    """
    keys = [key.upper() for key in CapdConfig.model_fields]
    found = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in _ENV_READ_ELSEWHERE:
            continue
        key, nested, rest = upper.removeprefix(ENV_PREFIX).partition("__")
        if key in keys:
            continue
        close = difflib.get_close_matches(key, keys, n=1)
        suggestion = f"{ENV_PREFIX}{close[0]}{nested}{rest}" if close else None
        found.append(UnknownVariable(name, suggestion))
    return tuple(found)


def _private_folder(folder: Path) -> None:
    """Make ``folder`` (and missing parents) readable by its owner only when capd makes
    it: the state directory holds the queue, the tokens and the seeded data."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for made in reversed(missing):
        made.mkdir(mode=0o700, exist_ok=True)


def _make_private(root: Path) -> None:
    """Take group and other permissions off everything under ``root`` (a seeded copy of
    files that may be world-readable in the package): its data is the owner's."""
    for folder, _dirs, files in os.walk(root):
        for name in (folder, *(os.path.join(folder, f) for f in files)):
            if not os.path.islink(name):
                os.chmod(name, os.stat(name).st_mode & 0o700)
