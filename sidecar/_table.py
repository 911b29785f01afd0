"""The one operator table: every operator command is one row.

The HTTP routes (``server/_api.py``) and the ``capd`` CLI subcommands
(``client/cli.py``) are both generated from :data:`COMMANDS`; a parity test
fails if either surface has something the table does not. A row names its
handler and its renderer rather than holding them, so the table is plain data
that both sides read and the client never imports the server.

A row's parameters are one model (``_args``): each field's type, default, limits and
help are written once, with where the value travels; the MCP schema, the CLI's flags,
the daemon's validation and the handler's typed input all come from it.

A row's ``examples`` are command lines shown under "Examples" in the
subcommand's ``--help``; they belong with the row so that a new command cannot
land without them (a test asks every subcommand for them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from capd.registry import LatencyClass, Safety

from ._args import Params, arg, input_schema, params_of

ProviderFormat = Literal["openai", "anthropic", "mcp"]
PROVIDER_FORMATS: tuple[ProviderFormat, ...] = get_args(ProviderFormat)
AgentFormat = Literal["json", "claude", "codex"]
AGENT_FORMATS: tuple[AgentFormat, ...] = get_args(AgentFormat)
MAX_CALLS = 8
"""How many calls ``POST /calls`` runs at once."""
MAX_PLAN = 1000
"""How many calls a pre-flight plan may hold."""
PAGE = 100
"""How many capabilities or jobs a list answers by default."""
MAX_PAGE = 1000
"""The most a list answers at once."""
MAX_K = 100
"""The most results a search answers."""


@dataclass(frozen=True)
class McpTool:
    """How a row is offered as an MCP tool: its name and description (its schema is the
    row's parameters that an agent may give)."""

    name: str
    description: str
    # The tool as the default ("brief") tool set offers it: a short description and only
    # the parameters marked brief (the others are still taken). None: the tool is offered
    # only in the full set (``capd mcp --tools full``, ``[mcp] tools``).
    brief: str | None = None


@dataclass(frozen=True)
class OperatorCommand:
    """One operator command, rendered as an HTTP route and a CLI subcommand."""

    id: str
    summary: str
    method: Literal["GET", "POST"]
    path: str
    cli: tuple[str, ...]
    handler: str        # a key of the server's handler table (server/_handlers.HANDLERS)
    params: type[Params] = Params
    # The CLI builds the JSON body from --params/-p: the value of the model's whole-body
    # field, or the body of its body fields.
    takes_params: bool = False
    render: str = "json"  # a key of the client's renderers (client/_render.RENDERERS)
    json_mode: bool = True
    mcp: McpTool | None = None
    # An operator row an operator may offer agents too ([mcp] operator_tools in capd.toml);
    # off by default, so the row still carries its cli_only reason.
    optional_mcp: McpTool | None = None
    # Why a row is kept off the agent's surface (never an MCP tool), when that is the point.
    operator_only: str | None = None
    # Why a row that is not operator-only is still not an MCP tool (a test requires one).
    cli_only: str | None = None
    examples: tuple[str, ...] = ()  # command lines for --help; a comment may follow "#"
    # Who may use the row: "operator" (root, the daemon's uid, operator_uids) and/or
    # "agent" (a peer bound by [[peers]], one narrowed by capd mcp --allow, or an
    # allow_uids peer that is no operator). Set for every row from ROLES below.
    roles: tuple[str, ...] = ()
    def __post_init__(self) -> None:
        placed = {p.key for p in params_of(self.params) if p.arg.at == "path"}
        if placed != set(re.findall(r"\{(\w+)\}", self.path)):
            raise ValueError(f"row {self.id}: its path {self.path} and its parameters' path "
                             f"fields ({', '.join(sorted(placed)) or 'none'}) must name the same")
        if self.operator_only is not None and (self.mcp or self.optional_mcp) is not None:
            raise ValueError(f"row {self.id}: an operator-only row is never an MCP tool")
        if self.mcp is not None and self.optional_mcp is not None:
            raise ValueError(f"row {self.id}: a row is an MCP tool always or on request")

    def schema(self, *, brief: bool = False) -> dict[str, Any]:
        """The MCP input schema of the row's parameters (``brief``: the brief tool's)."""
        return input_schema(self.params, brief)


# ---------------------------------------------------------------- parameters

CAPABILITY = "The capability id, e.g. notes.append."
TIMEOUT = "Give up sooner than the capability's own timeout_s (never later), in seconds."
IDEMPOTENCY = "Makes a retried write safe: a second call with the key answers the first's job."
CONTEXT = "The execution context, each key=value; run-time injections match it."
FORCE = "Probe even within the cooldown."


class HostIn(Params):
    """What the caller says its host has: what does not run there is left out."""

    host_os: str | None = arg(None, "Your host's OS (linux, darwin...).", "--host-os")
    host_gui: bool | None = arg(None, "Whether your host has a screen.", "--host-gui")
    host_tokens: tuple[str, ...] | None = arg(
        None, "The credentials your host holds (GITHUB_TOKEN...); empty: none.", "--host-tokens")
    host_scm: tuple[str, ...] | None = arg(
        None, "The source-control tools your host has (git...).", "--host-scm")


class ListIn(HostIn):
    state: Literal["live", "disabled"] | None = arg(None, "Only live or only disabled ones.",
                                                    "--state")
    tag: str | None = arg(None, "Only capabilities with this tag.", "--tag")
    limit: int = arg(PAGE, "Page size.", "--limit", ge=1, le=MAX_PAGE)
    cursor: str | None = arg(None, "next_cursor of the last page.", "--cursor")


class SearchIn(HostIn):
    query: str = arg("", "What you want to do, in words.", key="q", rest=True, brief=True)
    k: int | None = arg(None, "How many results (by default 3 for the inner loop, 8 for the "
                        "outer, else 5).", "-k", ge=1, le=MAX_K, brief=True)
    tags: tuple[str, ...] = arg((), "Only capabilities carrying all these tags.", "--tag",
                                key="tag")
    latency_class: LatencyClass | None = arg(None, "inner: fast local; outer: network; both.",
                                             "--latency-class")
    include_disabled: bool = arg(False, "Also disabled ones, with why.", "--include-disabled")
    safety: Safety | None = arg(None, "Only capabilities of this safety class.", "--safety")
    explain: bool = arg(False, "Say which terms and semantic neighbours matched.", "--explain")


class ShowIn(Params):
    id: str = arg(..., CAPABILITY, at="path", key="name", brief=True)
    format: ProviderFormat | None = arg(None, "Render the tool definition as this provider's "
                                        "tool-calling API expects it.", "--format")


class ExportIn(Params):
    format: ProviderFormat = arg(..., "The provider's tool-calling format.", "--format")
    profile: str | None = arg(None, "Only the capabilities this policy profile "
                              "([profiles.NAME] in capd.toml) takes in.", "--profile")
    include_disabled: bool = arg(False, "Also disabled capabilities (they heal; a call "
                                 "meanwhile says why).", "--include-disabled")


class CallIn(Params):
    id: str = arg(..., CAPABILITY, at="path", key="name", brief=True)
    arguments: dict[str, Any] = arg({}, "Parameters, per get_capability's schema.", at="body",
                                    key="*", brief=True)
    idempotency_key: str | None = arg(None, IDEMPOTENCY, "--idempotency-key", at="header",
                                      key="Idempotency-Key", brief=True)
    timeout_s: float | None = arg(None, TIMEOUT, "--timeout", at="header", key="Capd-Timeout",
                                  gt=0, allow_inf_nan=False)
    run_disabled: bool = arg(False, "Run it even though it is disabled (a write needs consent "
                             "for capd.run_disabled).", "--run-disabled", at="header",
                             key="Capd-Run-Disabled")
    output_dir: str | None = arg(None, "Write the image, audio and binary blocks an MCP server "
                                 "answered into this folder.", "--output-dir", at="local")
    wait_s: float | None = arg(None, "When the write is queued, wait up to this many seconds "
                               "for its job and exit as it ends (0 done, 1 dead or parked, 75 "
                               "still pending).", "--wait", at="local", gt=0)


class CallItem(BaseModel):
    """One call of a batch."""

    model_config = ConfigDict(frozen=True, defer_build=True)
    capability: str = arg(..., CAPABILITY)
    params: dict[str, Any] = arg({}, "Its parameters.")
    idempotency_key: str | None = arg(None, IDEMPOTENCY)


class CallManyIn(Params):
    calls: tuple[CallItem, ...] = arg(..., "The calls, each {capability, params}.", at="body",
                                      min_length=1, max_length=MAX_CALLS)
    timeout_s: float | None = arg(None, TIMEOUT, "--timeout", at="header", key="Capd-Timeout",
                                  gt=0, allow_inf_nan=False)


class PreflightIn(Params):
    # each call is checked on its own: a malformed one is refused by its index (the schema
    # still shows an agent the shape of one)
    calls: tuple[Any, ...] = arg(..., "The plan's calls, each {capability, params}.",
                                 at="body", min_length=1, max_length=MAX_PLAN,
                                 json_schema_extra={"items": CallItem.model_json_schema()})


class ResourceReadIn(Params):
    uri: str = arg(..., "The resource, as resources list names it.", at="body")
    output_dir: str | None = arg(None, "Write binary contents (blobs) into this folder.",
                                 "--output-dir", at="local")


class PromptGetIn(Params):
    prompt: str = arg(..., "A prompt's name (capd prompts list).", at="path")
    arguments: dict[str, str] = arg({}, "The prompt's arguments.", at="body", key="*")


class AnswerIn(Params):
    call: str = arg(..., "The call id a streamed call's question names.", at="path")
    question: str = arg(..., "The question's id in that call.", at="path")
    answer: Any = arg(None, "The answer, as the question's kind takes it.", at="body", key="*")


class TokenCreateIn(Params):
    profile: str | None = arg(None, "What the token reaches: a [profiles.NAME] of capd.toml "
                              "(read at each request).", "--profile", at="body")
    allow: tuple[str, ...] = arg((), "Or exactly these capabilities.", "--allow", at="body")
    name: str | None = arg(None, "A name for the logs and for revoke (default: the "
                           "profile's and a few letters).", "--name", at="body")
    channel: str | None = arg(None, "The conversation channel its holder speaks from.",
                              "--channel", at="body")
    ttl: str | None = arg(None, "How long it lasts, e.g. 12h, 30d (default: until revoked).",
                          "--ttl", at="body")


class TokenIn(Params):
    token: str = arg(..., "A token's name or id (capd token list).", at="path")


class ConsentGrantIn(Params):
    operations: tuple[str, ...] = arg(..., "The operations, e.g. vault.write.", at="body",
                                      rest=True, min_length=1)
    session: str | None = arg(None, "Only for this agent session.", "--session", at="body")
    ttl: str = arg("1h", "How long, e.g. 30m, 1h, 7d.", "--ttl", at="body")


class GrantIn(Params):
    id: str = arg(..., "The grant's id (capd consent list).", at="path")


class SessionIn(Params):
    session: str = arg(..., "The session (capd sessions list).", at="path")


class RecheckIn(Params):
    id: str = arg(..., "The capability id, e.g. notes.publish.", at="path", key="name")
    force: bool = arg(False, FORCE, "--force")


class RecheckToolIn(Params):
    tool: str = arg(..., "A tool's id (capd status lists them).", at="path")
    force: bool = arg(False, FORCE, "--force")


class PurgeIn(Params):
    state: Literal["done", "partial", "dead", "cancelled"] = arg(
        ..., "The finished jobs' state.", "--state")
    older_than: str = arg("7d", "E.g. 7d, 12h, 30m.", "--older-than")


class QueueListIn(Params):
    state: str | None = arg(None, "Only jobs in this state.", "--state")
    limit: int = arg(PAGE, "At most this many.", "--limit", ge=1, le=MAX_PAGE)


class JobIn(Params):
    id: str = arg(..., "A job's id (capd queue list).", at="path")


class AgentIn(Params):
    agent: str = arg(..., "An agent's name ([agents.NAME] in capd.toml).", at="path")


class ResolveIn(AgentIn):
    context: tuple[str, ...] = arg((), CONTEXT, "--context")
    format: AgentFormat = arg("json", "json (everything), claude (mcpServers) or codex (TOML).",
                              "--format")


class ValidateIn(Params):
    topology: str | None = arg(None, "A topology id (default: every topology).", key="id")


class TopologyIn(Params):
    id: str = arg(..., "The topology id.", at="path", key="topology")


class ExpandIn(TopologyIn):
    set: tuple[str, ...] = arg((), "Count overrides, each ROLE.count=N.", "--set")
    context: tuple[str, ...] = arg((), CONTEXT, "--context")


# ---------------------------------------------------------------- why a row is where it is

SESSIONS_ARE_THE_OPERATORS = ("an agent that could reset loop counts would undo its own "
                              "loop detection; the list shows every caller's sessions")
HEALTH_IS_FOR_SUPERVISORS = ("for supervisors and probes (systemd, a load balancer); an agent "
                             "learns a capability is down from search and its ToolResult")
RECOVERY_IS_THE_DAEMONS = ("capd rechecks and reloads by itself; an agent asking for it would "
                           "only add load (a call to a disabled capability rechecks first)")
STATS_ARE_FOR_OPERATORS = "operator statistics; nothing an agent should act on"
QUEUE_IS_THE_OPERATORS = ("the retry queue is the operator's: an agent learns of its write from "
                          "the queued job id in its ToolResult")
AGENTS_ARE_CONFIGURED = ("agent configuration is for the host that launches agents, not for an "
                         "agent to read about itself")
TOPOLOGY_VALIDATION_IS_AUTHORING = "validation is for whoever writes topologies"
OFFERS_ARE_NATIVE = ("an MCP client lists and reads them with resources/list, resources/read, "
                     "prompts/list and prompts/get, which capd mcp serves natively")
QUESTIONS_ARE_RELAYED = ("capd mcp answers a server's questions itself: it relays them to its "
                         "client as sampling or elicitation requests")
TOKENS_ARE_THE_OPERATORS = ("a token is a grant; an agent that could make one could widen "
                            "itself")
CONSENT_IS_THE_OPERATORS = ("consent is given by a person through the operator's surface; an "
                            "agent that could grant it would consent to itself")


COMMANDS: tuple[OperatorCommand, ...] = (
    OperatorCommand("health", "Overall health (application/health+json).", "GET", "/health",
                    ("health",), "health", render="health",
                    examples=("capd health", "capd health --json | jq .checks")),
    OperatorCommand("livez", "Liveness: 200 while the process serves.", "GET", "/livez",
                    ("livez",), "livez", json_mode=False,
                    examples=("capd livez || systemctl restart capd",)),
    OperatorCommand("readyz", "Readiness: 503 while starting or draining.", "GET", "/readyz",
                    ("readyz",), "readyz", json_mode=False,
                    examples=("until capd readyz; do sleep 1; done   # wait for start-up",)),
    OperatorCommand(
        "list", "List capabilities as capsules.", "GET", "/capabilities", ("list",), "list_caps",
        params=ListIn, render="list",
        examples=("capd list", "capd list --state disabled", "capd list --tag notes --json"),
        mcp=McpTool(
            "list_capabilities",
            "List capabilities as short capsules, a page at a time, optionally by tag or "
            "state. Use search_capabilities to find one by what it does."),
    ),
    OperatorCommand(
        "search", "Search capabilities by words, tags and latency class.", "GET", "/search",
        ("search",), "search", params=SearchIn, render="search",
        examples=("capd search append a line to a note",
                  "capd search -k 10 --tag notes snapshot",
                  "capd search --include-disabled publish a note   # also disabled ones, with why",
                  "capd search --safety read_only notes   # only what changes nothing"),
        mcp=McpTool(
            "search_capabilities",
            "Find capabilities by what you want to do. Returns the best matches as capsules "
            "(id, summary, tags, live or disabled); then get_capability for the schema and "
            "invoke_capability to call it.",
            brief="Find capabilities for a task: ids, summaries, live or disabled."),
    ),
    OperatorCommand(
        "show", "Full manifest of one capability, with JSON Schema.", "GET",
        "/capabilities/{name}", ("show",), "show", params=ShowIn,
        examples=("capd show notes.append", "capd show notes.append --json | jq .parameters",
                  "capd show notes.append --format openai   # a function tool for OpenAI"),
        mcp=McpTool(
            "get_capability",
            "The full manifest of one capability: description, parameters' JSON Schema, "
            "required tools, effects, retry policy, and why it is disabled if it is.",
            brief="A capability's parameters (JSON Schema), effects and state."),
    ),
    OperatorCommand(
        "export", "Every capability's tool definition in one provider's format.", "GET",
        "/export", ("export",), "export", params=ExportIn, render="export",
        examples=("capd export --format openai > tools.json   # the tools= list",
                  "capd export --format anthropic --profile reader > reader-tools.json",
                  "capd export --format mcp --json | jq .skipped   # what could not go"),
        cli_only=("a file for the host that configures an agent; an agent reads the same "
                  "definitions one at a time through get_capability"),
    ),
    OperatorCommand(
        "call", "Call a capability with JSON parameters.", "POST", "/call/{name}", ("call",),
        "call", params=CallIn, takes_params=True, render="call",
        examples=(
            'capd call notes.append -p note=welcome -p "line=hello from capd"   # key=value: text',
            "capd call notes.search -p query=capd -p limit:=3   # key:=json: a number, list, ...",
            """capd call notes.create --params '{"note": "todo", "title": "To do"}'""",
            "capd call notes.append -p note=welcome -p line=hi --json   # the whole ToolResult",
            "capd call notes.search -p query=capd --timeout 2.5   # a shorter timeout",
            "capd call notes.search -p query=capd --run-disabled   # even while disabled",
            "capd call paint_mcp.paint -p title=cat --output-dir out/   # save its images",
            "capd call notes.append -p note=a -p line=b --wait 60   # exit 75 while queued",
        ),
        mcp=McpTool(
            "invoke_capability",
            "Call a capability with its arguments. The result has a status (success, "
            "partial, error_transient, error_permanent, error_blocked); a write that failed "
            "transiently is queued and its job id is in 'queued'.",
            brief="Call a capability. Result: status (success, partial, error_*) and "
                  "result; a failed write may be queued."),
    ),
    OperatorCommand(
        "call-many", f"Run up to {MAX_CALLS} calls at once; every result, in order.", "POST",
        "/calls", ("call-many",), "call_many", params=CallManyIn, takes_params=True,
        examples=(
            """capd call-many --params '{"calls": [{"capability": "notes.search", """
            """"params": {"query": "a"}}, {"capability": "notes.search", "params": """
            """{"query": "b"}}]}'""",),
        mcp=McpTool(
            "invoke_many",
            f"Call up to {MAX_CALLS} capabilities at once (an outer loop's parallel calls). "
            "Each runs as invoke_capability would; the results come back in order, each "
            "with its http_status and tool_result (or problem)."),
    ),
    OperatorCommand(
        "preflight", "Check a plan of calls at once: consent needed, refusals and why.", "POST",
        "/preflight", ("preflight",), "preflight", params=PreflightIn, takes_params=True,
        examples=(
            """capd preflight --params '{"calls": [{"capability": "notes.append", """
            """"params": {"note": "a", "line": "b"}}]}'""",
            "capd preflight --params \"$(cat plan.json)\" --json",
        ),
        mcp=McpTool(
            "preflight_calls",
            "Before running a plan, check all its calls in one round trip: the consent "
            "operations still needed (ask the user once for all of them), and the calls that "
            "would be refused and why (unknown, disabled, invalid parameters, outside your "
            "profile)."),
    ),
    OperatorCommand(
        "resources", "Upstream MCP servers' resources and templates (capd://<prefix>/<uri>).",
        "GET", "/resources", ("resources", "list"), "resources", render="offers",
        examples=("capd resources list", "capd resources list --json | jq '.resources[].uri'")),
    OperatorCommand(
        "resource-read", "Read an upstream's resource: text printed, binary saved.", "POST",
        "/resources/read", ("resources", "read"), "resource_read", params=ResourceReadIn,
        render="contents",
        examples=("capd resources read capd://everything/demo://resource/static/document/"
                  "architecture.md",
                  "capd resources read capd://files/file:///srv/logo.png --output-dir out/")),
    OperatorCommand(
        "prompts", "Upstream MCP servers' prompts (<prefix>.<name>).", "GET", "/prompts",
        ("prompts", "list"), "prompts", render="offers",
        examples=("capd prompts list", "capd prompts list --json | jq '.prompts[].name'")),
    OperatorCommand(
        "prompt-get", "Get an upstream's prompt with its arguments.", "POST",
        "/prompts/{prompt}", ("prompts", "get"), "prompt_get", params=PromptGetIn,
        takes_params=True, render="prompt",
        examples=("capd prompts get everything.simple-prompt",
                  "capd prompts get everything.args-prompt -p city=Paris -p state=Texas")),
    OperatorCommand(
        "call-answer", "Answer a question a server asked during a streamed call.", "POST",
        "/calls/{call}/answers/{question}", ("answer",), "call_answer", params=AnswerIn,
        takes_params=True,
        examples=("""capd answer CALL 1 --params '{"result": {"action": "decline"}}'""",)),
    OperatorCommand(
        "token-create", "Make a bearer token for the MCP front door over HTTP.", "POST",
        "/tokens", ("token", "create"), "token_create", params=TokenCreateIn, render="token",
        examples=("capd token create --profile reader --ttl 30d --name ci-agent",
                  "capd token create --allow notes.search,notes.read --json | jq -r .token"),
        operator_only=TOKENS_ARE_THE_OPERATORS),
    OperatorCommand("token-list", "Bearer tokens: name, reach, state (never the token).",
                    "GET", "/tokens", ("token", "list"), "token_list", render="tokens",
                    operator_only=TOKENS_ARE_THE_OPERATORS,
                    examples=("capd token list", "capd token list --json")),
    OperatorCommand("token-revoke", "Revoke a bearer token: refused from its next request.",
                    "POST", "/tokens/{token}/revoke", ("token", "revoke"), "token_revoke",
                    params=TokenIn, operator_only=TOKENS_ARE_THE_OPERATORS,
                    examples=("capd token revoke ci-agent   # by name or id",)),
    OperatorCommand(
        "consent-grant", "Grant consent for operations, for a while, maybe one session.",
        "POST", "/consent", ("consent", "grant"), "consent_grant", params=ConsentGrantIn,
        operator_only=CONSENT_IS_THE_OPERATORS,
        examples=("capd consent grant vault.write --ttl 1h",
                  "capd consent grant vault.write mail.send --session 7f3a --ttl 30m"),
    ),
    OperatorCommand("consent-list", "Live consent grants, soonest to expire first.", "GET",
                    "/consent", ("consent", "list"), "consent_list",
                    operator_only=CONSENT_IS_THE_OPERATORS,
                    examples=("capd consent list", "capd consent list --json")),
    OperatorCommand("consent-revoke", "Revoke a consent grant.", "POST",
                    "/consent/{id}/revoke", ("consent", "revoke"), "consent_revoke",
                    params=GrantIn, operator_only=CONSENT_IS_THE_OPERATORS,
                    examples=("capd consent revoke GRANT_ID   # the id from consent list",)),
    OperatorCommand("sessions", "Agent sessions loop detection is counting.", "GET",
                    "/sessions", ("sessions", "list"), "sessions_list",
                    operator_only=SESSIONS_ARE_THE_OPERATORS,
                    examples=("capd sessions list",)),
    OperatorCommand("sessions-reset", "Forget a session's loop counts (unblocks it).", "POST",
                    "/sessions/{session}/reset", ("sessions", "reset"), "sessions_reset",
                    params=SessionIn, operator_only=SESSIONS_ARE_THE_OPERATORS,
                    examples=("capd sessions reset 7f3a",)),
    OperatorCommand("recheck", "Re-probe a disabled capability's missing tools.", "POST",
                    "/recheck/{name}", ("recheck",), "recheck", params=RecheckIn,
                    examples=("capd recheck notes.publish",
                              "capd recheck notes.publish --force   # even within the cooldown"),
                    optional_mcp=McpTool(
                        "recheck",
                        "Re-probe a disabled capability's missing tools now and say what came "
                        "back: live is true when it was restored. Probes within the cooldown "
                        "are answered from the last result unless force is true.")),
    OperatorCommand("recheck-tool", "Re-probe one tool and restore what it unblocks.", "POST",
                    "/recheck-tool/{tool}", ("recheck-tool",), "recheck_tool",
                    params=RecheckToolIn,
                    examples=("capd recheck-tool sync_server --force",)),
    OperatorCommand("reload", "Full reload: config, declarations, plugins, probes.", "POST",
                    "/reload", ("reload",), "reload",
                    examples=("capd reload   # waits for the outcome; exit 1 says why it failed",
                              "systemctl reload capd   # the unit's ExecReload runs capd reload"),
                    optional_mcp=McpTool(
                        "reload",
                        "Reload capd fully (config, declarations, plugins, every probe) and "
                        "answer when it is done: ok, how long it took, and the error if it "
                        "failed (the previous registry then keeps serving).")),
    OperatorCommand("whoami", "Who the daemon takes you for: role, profile, channel, reach.",
                    "GET", "/whoami", ("whoami",), "whoami",
                    examples=("capd whoami", "capd whoami --json | jq .role")),
    OperatorCommand("status", "Registry, reload and task statistics.", "GET", "/status",
                    ("status",), "status",
                    examples=("capd status", "capd status --json | jq .reload")),
    OperatorCommand("metrics", "Prometheus metrics (text format).", "GET", "/metrics",
                    ("metrics",), "metrics", json_mode=False,
                    examples=("capd metrics | grep capd_calls_total",)),
    # /queue/stats and /queue/purge come before /queue/{id} so that they match first.
    OperatorCommand("queue-stats", "Retry queue counts, oldest pending age, sweep outcomes.",
                    "GET", "/queue/stats", ("queue", "stats"), "queue_stats",
                    examples=("capd queue stats",)),
    OperatorCommand("queue-purge", "Delete finished jobs of one state older than a duration.",
                    "POST", "/queue/purge", ("queue", "purge"), "queue_purge", params=PurgeIn,
                    examples=("capd queue purge --state done --older-than 7d",)),
    OperatorCommand("queue-list", "List retry jobs, newest first.", "GET", "/queue",
                    ("queue", "list"), "queue_list", params=QueueListIn, render="jobs",
                    examples=("capd queue list",
                              "capd queue list --state needs_operator --limit 20")),
    OperatorCommand("queue-show", "One retry job with its attempts.", "GET", "/queue/{id}",
                    ("queue", "show"), "queue_show", params=JobIn,
                    examples=("capd queue show JOB_ID   # the ID column of `capd queue list`",)),
    OperatorCommand("queue-retry", "Make a parked or dead job due now.", "POST",
                    "/queue/{id}/retry", ("queue", "retry"), "queue_retry", params=JobIn,
                    examples=("capd queue retry JOB_ID",)),
    OperatorCommand("queue-cancel", "Cancel a job that is not running.", "POST",
                    "/queue/{id}/cancel", ("queue", "cancel"), "queue_cancel", params=JobIn,
                    examples=("capd queue cancel JOB_ID",)),
    OperatorCommand("agent-list", "Agents declared in capd.toml, and the run-time injections.",
                    "GET", "/agents", ("agent", "list"), "agents_list", render="agents",
                    examples=("capd agent list", "capd agent list --json | jq '.injections'")),
    OperatorCommand("agent-show", "One agent's entries and what each selects now.", "GET",
                    "/agents/{agent}", ("agent", "show"), "agent_show", params=AgentIn,
                    render="agent", examples=("capd agent show reviewer",)),
    OperatorCommand(
        "agent-resolve", "The MCP servers an agent's runtime needs, in an execution context.",
        "GET", "/agents/{agent}/resolve", ("agent", "resolve"), "agent_resolve",
        params=ResolveIn,
        examples=("capd agent resolve reviewer   # capabilities, expansion, injected, servers",
                  "capd agent resolve reviewer --context silent=true --format claude > .mcp.json",
                  "capd agent resolve reviewer --format codex >> ~/.codex/config.toml"),
    ),
    # /topologies/validate comes before /topologies/{topology}: "validate" is no topology's id.
    OperatorCommand(
        "topology-list", "Topologies declared in the declaration files.", "GET", "/topologies",
        ("topology", "list"), "topologies_list", render="topologies",
        examples=("capd topology list", "capd topology list --json | jq '.errors'"),
        mcp=McpTool("list_topologies",
                    "List the declared topologies: ways for several agents to work together "
                    "(roles, groups, phases). Then get_topology or expand_topology."),
    ),
    OperatorCommand(
        "topology-validate", "Check one topology, or all; exit 1 naming every problem.", "GET",
        "/topologies/validate", ("topology", "validate"), "topology_validate",
        params=ValidateIn, render="validation",
        examples=("capd topology validate   # every topology; exit 1 on any problem",
                  "capd topology validate review"),
    ),
    OperatorCommand(
        "topology-show", "One topology as declared, with the problems found in it.", "GET",
        "/topologies/{topology}", ("topology", "show"), "topology_show", params=TopologyIn,
        examples=("capd topology show review",),
        mcp=McpTool("get_topology",
                    "One topology as declared: its roles (responsibilities, agent, count), "
                    "groups, phases (fanout, fanin), required evidence, and any problem."),
    ),
    OperatorCommand(
        "topology-expand", "Materialise a topology's instances, each with its agent's config.",
        "GET", "/topologies/{topology}/expand", ("topology", "expand"), "topology_expand",
        params=ExpandIn,
        examples=("capd topology expand review",
                  "capd topology expand review --set reviewer.count=5 --context silent=true"),
        mcp=McpTool("expand_topology",
                    "Materialise a topology: every role instance (reviewer-1 ... reviewer-N "
                    "when count > 1) with its agent's capabilities and MCP server configs, "
                    "and the groups and phases by instance. Refuses an invalid topology."),
    ),
)


# Why each row that is neither an MCP tool nor operator-only stays on the CLI and HTTP
# surfaces only (the parity test fails on a one-surface row without a reason).
_CLI_ONLY = {
    **dict.fromkeys(("health", "livez", "readyz"), HEALTH_IS_FOR_SUPERVISORS),
    **dict.fromkeys(("recheck", "recheck-tool", "reload"), RECOVERY_IS_THE_DAEMONS),
    **dict.fromkeys(("status", "metrics"), STATS_ARE_FOR_OPERATORS),
    **dict.fromkeys(("queue-stats", "queue-purge", "queue-list", "queue-show", "queue-retry",
                     "queue-cancel"), QUEUE_IS_THE_OPERATORS),
    **dict.fromkeys(("agent-list", "agent-show", "agent-resolve"), AGENTS_ARE_CONFIGURED),
    "topology-validate": TOPOLOGY_VALIDATION_IS_AUTHORING,
    **dict.fromkeys(("resources", "resource-read", "prompts", "prompt-get"), OFFERS_ARE_NATIVE),
    "call-answer": QUESTIONS_ARE_RELAYED,
    "whoami": ("the bridge reads it to know what to offer; an agent learns its reach from "
               "search and list, which show only what it may use"),
}

OPERATOR = ("operator",)
EVERYONE = ("operator", "agent")
ROLES: dict[str, tuple[str, ...]] = {
    # supervisors' probes: an agent sees only the capabilities inside its grant in /health
    **dict.fromkeys(("health", "livez", "readyz"), EVERYONE),
    # what an agent works with, each answer limited to its grant
    **dict.fromkeys(("list", "search", "show", "export", "call", "call-many", "preflight",
                     "whoami"), EVERYONE),
    # upstreams' resources and prompts inside the grant; answers to one's own call only
    **dict.fromkeys(("resources", "resource-read", "prompts", "prompt-get", "call-answer"),
                    EVERYONE),
    # a capability inside the grant only (anything else is unknown to it)
    "recheck": EVERYONE,
    # agents and topologies an agent may read: only those wholly inside its grant
    **dict.fromkeys(("agent-list", "agent-show", "agent-resolve", "topology-list",
                     "topology-validate", "topology-show", "topology-expand"), EVERYONE),
    # the operator's: a tool unblocks capabilities outside any one grant; a reload, the
    # statistics and the queue (every job's parameters) are the whole daemon's
    **dict.fromkeys(("recheck-tool", "reload", "status", "metrics", "queue-stats",
                     "queue-purge", "queue-list", "queue-show", "queue-retry", "queue-cancel",
                     "consent-grant", "consent-list", "consent-revoke", "sessions",
                     "sessions-reset", "token-create", "token-list", "token-revoke"),
                    OPERATOR),
}
"""Who may use each row; the router refuses anyone else with 403 (every row is here)."""

COMMANDS = tuple(replace(row, cli_only=_CLI_ONLY.get(row.id, row.cli_only),
                         roles=ROLES[row.id]) for row in COMMANDS)


_NATIVE = {"resources": "resources/list", "resource-read": "resources/read",
           "prompts": "prompts/list", "prompt-get": "prompts/get",
           "call-answer": "(sampling, elicitation)"}
"""Rows capd mcp serves as MCP methods of their own rather than as tools."""


def role_table() -> str:
    """The README's Policy table: every row's surfaces and who may use it (markdown)."""
    lines = ["| command | HTTP | MCP tool | operator | agent |", "|---|---|---|---|---|"]
    for row in COMMANDS:
        tool = (row.mcp.name if row.mcp else
                f"{row.optional_mcp.name} (if offered)" if row.optional_mcp else
                _NATIVE.get(row.id, "—"))
        cells = ["yes" if role in row.roles else "403" for role in ("operator", "agent")]
        lines.append(f"| `capd {' '.join(row.cli)}` | `{row.method} {row.path}` | {tool} | "
                     f"{cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def command(command_id: str) -> OperatorCommand:
    """Return the row ``command_id``; raise KeyError."""
    for row in COMMANDS:
        if row.id == command_id:
            return row
    raise KeyError(command_id)
