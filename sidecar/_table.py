"""The one operator table: every operator command is one row.

The HTTP routes (``server/_api.py``) and the ``capd`` CLI subcommands
(``client/cli.py``) are both generated from :data:`COMMANDS`; a parity test
fails if either surface has something the table does not. A row names its
handler and its renderer rather than holding them, so the table is plain data
that both sides read and the client never imports the server.

A row's ``examples`` are command lines shown under "Examples" in the
subcommand's ``--help``; they belong with the row so that a new command cannot
land without them (a test asks every subcommand for them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal


@dataclass(frozen=True)
class Option:
    """A CLI option carried to the daemon in the query string, the JSON body or a header."""

    flags: tuple[str, ...]
    dest: str
    help: str
    # "local": the CLI's own, never sent (where it writes what the answer carries)
    target: Literal["query", "body", "header", "local"] = "query"
    header: str | None = None  # the header's name, for target="header"
    is_flag: bool = False
    choices: tuple[str, ...] | None = None
    positional: bool = False
    # A positional that takes every remaining word (sent joined by spaces), so that
    # `capd search append a line` needs no quotes.
    rest: bool = False
    # An option given any number of times (`--context a=1 --context b=2`), sent joined by
    # commas (`context=a=1,b=2`); a value cannot hold a comma.
    repeat: bool = False
    # A positional that may be left out (`capd topology validate [TOPOLOGY]`).
    optional: bool = False
    # What the value must read as; the CLI refuses anything else as a usage error (exit 2).
    value: Literal["text", "count", "seconds"] = "text"
    # An option the command needs (`capd export --format F`).
    required: bool = False


@dataclass(frozen=True)
class McpTool:
    """How a row is offered as an MCP tool: its name, schema, and where each argument goes."""

    name: str
    description: str
    input_schema: dict[str, Any]
    path: dict[str, str] = field(default_factory=dict)     # argument -> path parameter
    query: dict[str, str] = field(default_factory=dict)    # argument -> query key
    body: str | None = None                                # argument sent as the JSON body
    headers: dict[str, str] = field(default_factory=dict)  # argument -> header
    # The tool as the default ("brief") tool set offers it: a short description and only
    # the arguments an agent needs first (the others are still taken). None: the tool
    # is offered only in the full set (``capd mcp --tools full``, ``[mcp] tools``).
    brief: tuple[str, dict[str, Any]] | None = None


@dataclass(frozen=True)
class OperatorCommand:
    """One operator command, rendered as an HTTP route and a CLI subcommand."""

    id: str
    summary: str
    method: Literal["GET", "POST"]
    path: str
    cli: tuple[str, ...]
    handler: str        # a key of the server's handler table (server/_handlers.HANDLERS)
    options: tuple[Option, ...] = ()
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
    path_params: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path_params", tuple(re.findall(r"\{(\w+)\}", self.path)))
        for option in self.options:
            if (option.target == "header") != (option.header is not None):
                raise ValueError(f"row {self.id}: option {option.dest} names a header exactly "
                                 "when its target is 'header'")
        if self.operator_only is not None and (self.mcp or self.optional_mcp) is not None:
            raise ValueError(f"row {self.id}: an operator-only row is never an MCP tool")
        if self.mcp is not None and self.optional_mcp is not None:
            raise ValueError(f"row {self.id}: a row is an MCP tool always or on request")


FORCE = Option(("--force",), "force", "ignore the per-tool cooldown", is_flag=True)
HOST = (
    Option(("--host-os",), "host_os", "the caller's OS (linux, darwin...): leave out what "
           "does not run there"),
    Option(("--host-gui",), "host_gui", "whether the caller has a graphical session",
           choices=("true", "false")),
    Option(("--host-tokens",), "host_tokens", "the credentials the caller holds "
           "(comma-separated; an empty value: none)"),
    Option(("--host-scm",), "host_scm", "the source-control tools the caller has "
           "(comma-separated)"),
)
HOST_ARGS = {
    "host_os": {"type": "string", "description": "Your host's OS: what does not run there "
                "is left out."},
    "host_gui": {"type": "boolean", "description": "Whether your host has a screen."},
    "host_tokens": {"type": "array", "items": {"type": "string"},
                    "description": "The credentials your host holds (GITHUB_TOKEN...)."},
    "host_scm": {"type": "array", "items": {"type": "string"},
                 "description": "The source-control tools your host has (git...)."},
}
HOST_QUERY = {key: key for key in HOST_ARGS}
SESSIONS_ARE_THE_OPERATORS = ("an agent that could reset loop counts would undo its own "
                              "loop detection; the list shows every caller's sessions")
AGENT_FORMATS = ("json", "claude", "codex")
PROVIDER_FORMATS = ("openai", "anthropic", "mcp")
CONTEXT = Option(("--context",), "context", "the execution context as key=value (repeatable); "
                 "run-time injections match it", repeat=True)
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
        options=(
            Option(("--state",), "state", "only live or disabled ones",
                   choices=("live", "disabled")),
            Option(("--tag",), "tag", "only capabilities with this tag"),
            Option(("--limit",), "limit", "at most this many (default 1000)", value="count"),
            Option(("--cursor",), "cursor", "next_cursor of the previous page"),
            *HOST,
        ),
        render="list",
        examples=("capd list", "capd list --state disabled", "capd list --tag notes --json"),
        mcp=McpTool(
            "list_capabilities",
            "List capabilities as short capsules, a page at a time, optionally by tag or "
            "state. Use search_capabilities to find one by what it does.",
            {"type": "object", "properties": {
                "tag": {"type": "string", "description": "Only capabilities with this tag."},
                "state": {"type": "string", "enum": ["live", "disabled"],
                          "description": "Only live or only disabled ones."},
                "cursor": {"type": "string", "description": "next_cursor of the last page."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 200,
                          "description": "Page size (default 50)."}}},
            query={"tag": "tag", "state": "state", "cursor": "cursor", "limit": "limit"},
        ),
    ),
    OperatorCommand(
        "search", "Search capabilities by words, tags and latency class.", "GET", "/search",
        ("search",), "search",
        options=(
            Option(("query",), "q", "what you want to do, in words (no quotes needed)",
                   positional=True, rest=True),
            Option(("-k",), "k", "how many results (default 5)", value="count"),
            Option(("--tag",), "tag", "only capabilities with these tags (comma-separated)"),
            Option(("--latency-class",), "latency_class", "inner, outer or both",
                   choices=("inner", "outer", "both")),
            Option(("--include-disabled",), "include_disabled",
                   "also disabled capabilities, with why", is_flag=True),
            Option(("--safety",), "safety", "only capabilities of this safety class",
                   choices=("read_only", "writes", "destructive", "external_side_effects")),
            Option(("--explain",), "explain",
                   "say which terms and semantic neighbours matched", is_flag=True),
            *HOST,
        ),
        render="search",
        examples=("capd search append a line to a note",
                  "capd search -k 10 --tag notes snapshot",
                  "capd search --include-disabled publish a note   # also disabled ones, with why",
                  "capd search --safety read_only notes   # only what changes nothing"),
        mcp=McpTool(
            "search_capabilities",
            "Find capabilities by what you want to do. Returns the best matches as capsules "
            "(id, summary, tags, live or disabled); then get_capability for the schema and "
            "invoke_capability to call it.",
            {"type": "object", "required": ["query"], "properties": {
                "query": {"type": "string", "description": "What you want to do, in words."},
                "k": {"type": "integer", "minimum": 1, "maximum": 50,
                      "description": "How many results (default 5)."},
                "tags": {"type": "array", "items": {"type": "string"},
                         "description": "Only capabilities carrying all these tags."},
                "latency_class": {"type": "string", "enum": ["inner", "outer", "both"],
                                  "description": "inner: fast local; outer: network."},
                "include_disabled": {"type": "boolean",
                                     "description": "Also list disabled ones, with why."},
                "safety": {"type": "string", "enum": ["read_only", "writes", "destructive",
                                                      "external_side_effects"],
                           "description": "Only capabilities of this safety class."},
                **HOST_ARGS}},
            query={"query": "q", "k": "k", "tags": "tag", "latency_class": "latency_class",
                   "include_disabled": "include_disabled", "safety": "safety", **HOST_QUERY},
            brief=("Find capabilities for a task: ids, summaries, live or disabled.",
                   {"type": "object", "required": ["query"], "properties": {
                       "query": {"type": "string", "description": "The task, in words."},
                       "k": {"type": "integer", "description": "How many (5)."}}}),
        ),
    ),
    OperatorCommand(
        "show", "Full manifest of one capability, with JSON Schema.", "GET",
        "/capabilities/{name}", ("show",), "show",
        options=(Option(("--format",), "format", "render the tool definition as this "
                        "provider's tool-calling API expects it instead of the manifest",
                        choices=PROVIDER_FORMATS),),
        examples=("capd show notes.append", "capd show notes.append --json | jq .parameters",
                  "capd show notes.append --format openai   # a function tool for OpenAI"),
        mcp=McpTool(
            "get_capability",
            "The full manifest of one capability: description, parameters' JSON Schema, "
            "required tools, effects, retry policy, and why it is disabled if it is.",
            {"type": "object", "required": ["id"], "properties": {
                "id": {"type": "string", "description": "The capability id, e.g. notes.append."}}},
            path={"id": "name"},
            brief=("A capability's parameters (JSON Schema), effects and state.",
                   {"type": "object", "required": ["id"], "properties": {
                       "id": {"type": "string"}}}),
        ),
    ),
    OperatorCommand(
        "export", "Every capability's tool definition in one provider's format.", "GET",
        "/export", ("export",), "export",
        options=(Option(("--format",), "format", "the provider's tool-calling format",
                        choices=PROVIDER_FORMATS, required=True),
                 Option(("--profile",), "profile", "only the capabilities this policy "
                        "profile ([profiles.NAME] in capd.toml) takes in"),
                 Option(("--include-disabled",), "include_disabled",
                        "also disabled capabilities (they heal; a call meanwhile says why)",
                        is_flag=True)),
        render="export",
        examples=("capd export --format openai > tools.json   # the tools= list",
                  "capd export --format anthropic --profile reader > reader-tools.json",
                  "capd export --format mcp --json | jq .skipped   # what could not go"),
        cli_only=("a file for the host that configures an agent; an agent reads the same "
                  "definitions one at a time through get_capability"),
    ),
    OperatorCommand(
        "call", "Call a capability with JSON parameters.", "POST", "/call/{name}", ("call",),
        "call", takes_params=True, render="call",
        options=(
            Option(("--timeout",), "timeout_s", "give up after this many seconds (at most the "
                   "capability's timeout_s)", target="header", header="Capd-Timeout",
                   value="seconds"),
            Option(("--run-disabled",), "run_disabled", "run it even though it is disabled "
                   "(a write needs consent for capd.run_disabled)", is_flag=True,
                   target="header", header="Capd-Run-Disabled"),
            Option(("--output-dir",), "output_dir", "write the image, audio and binary "
                   "blocks an MCP server answered into this folder (never onto the terminal)",
                   target="local"),
            Option(("--wait",), "wait_s", "when the write is queued, wait up to this many "
                   "seconds for its job and exit as it ends (0 done, 1 dead or parked, 75 "
                   "still pending)", target="local"),
        ),
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
            {"type": "object", "required": ["id"], "properties": {
                "id": {"type": "string", "description": "The capability id."},
                "arguments": {"type": "object",
                              "description": "Parameters, per get_capability's schema."},
                "idempotency_key": {"type": "string",
                                    "description": "Makes a retried write safe."},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0,
                              "description": "Give up sooner than the capability's own "
                              "timeout_s (never later)."},
                "run_disabled": {"type": "boolean",
                                 "description": "Run it even though it is disabled (a write "
                                 "needs the user's consent for capd.run_disabled)."}}},
            path={"id": "name"}, body="arguments",
            headers={"idempotency_key": "Idempotency-Key", "timeout_s": "Capd-Timeout",
                     "run_disabled": "Capd-Run-Disabled"},
            brief=("Call a capability. Result: status (success, partial, error_*) and "
                   "result; a failed write may be queued.",
                   {"type": "object", "required": ["id"], "properties": {
                       "id": {"type": "string"},
                       "arguments": {"type": "object",
                                     "description": "Per get_capability's schema."},
                       "idempotency_key": {"type": "string"}}}),
        ),
    ),
    OperatorCommand(
        "call-many", "Run up to 8 calls at once; every result, in order.", "POST", "/calls",
        ("call-many",), "call_many", takes_params=True, render="json",
        options=(Option(("--timeout",), "timeout_s", "give up on each after this many "
                        "seconds (at most its capability's timeout_s)", target="header",
                        header="Capd-Timeout", value="seconds"),),
        examples=(
            """capd call-many --params '{"calls": [{"capability": "notes.search", """
            """"params": {"query": "a"}}, {"capability": "notes.search", "params": """
            """{"query": "b"}}]}'""",),
        mcp=McpTool(
            "invoke_many",
            "Call up to 8 capabilities at once (an outer loop's parallel calls). Each runs "
            "as invoke_capability would; the results come back in order, each with its "
            "http_status and tool_result (or problem).",
            {"type": "object", "required": ["calls"], "properties": {
                "calls": {"type": "array", "minItems": 1, "maxItems": 8,
                          "description": "The calls, each {capability, params}.",
                          "items": {"type": "object", "required": ["capability"],
                                    "properties": {
                                        "capability": {"type": "string",
                                                       "description": "The capability id."},
                                        "params": {"type": "object",
                                                   "description": "Its parameters."},
                                        "idempotency_key": {
                                            "type": "string",
                                            "description": "Makes a retried write safe."}}}}}},
            body="*",
        ),
    ),
    OperatorCommand(
        "preflight", "Check a plan of calls at once: consent needed, refusals and why.", "POST",
        "/preflight", ("preflight",), "preflight", takes_params=True,
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
            "profile).",
            {"type": "object", "required": ["calls"], "properties": {
                "calls": {"type": "array", "items": {
                    "type": "object", "required": ["capability"], "properties": {
                        "capability": {"type": "string"},
                        "params": {"type": "object"}}}}}},
            body="*",
        ),
    ),
    OperatorCommand(
        "resources", "Upstream MCP servers' resources and templates (capd://<prefix>/<uri>).",
        "GET", "/resources", ("resources", "list"), "resources", render="offers",
        examples=("capd resources list", "capd resources list --json | jq '.resources[].uri'")),
    OperatorCommand(
        "resource-read", "Read an upstream's resource: text printed, binary saved.", "POST",
        "/resources/read", ("resources", "read"), "resource_read", render="contents",
        options=(Option(("uri",), "uri", "the resource, as resources list names it",
                        positional=True, target="body"),
                 Option(("--output-dir",), "output_dir", "write binary contents (blobs) into "
                        "this folder (never onto the terminal)", target="local")),
        examples=("capd resources read capd://everything/demo://resource/static/document/"
                  "architecture.md",
                  "capd resources read capd://files/file:///srv/logo.png --output-dir out/")),
    OperatorCommand(
        "prompts", "Upstream MCP servers' prompts (<prefix>.<name>).", "GET", "/prompts",
        ("prompts", "list"), "prompts", render="offers",
        examples=("capd prompts list", "capd prompts list --json | jq '.prompts[].name'")),
    OperatorCommand(
        "prompt-get", "Get an upstream's prompt with its arguments.", "POST",
        "/prompts/{prompt}", ("prompts", "get"), "prompt_get", takes_params=True,
        render="prompt",
        examples=("capd prompts get everything.simple-prompt",
                  "capd prompts get everything.args-prompt -p city=Paris -p state=Texas")),
    OperatorCommand(
        "call-answer", "Answer a question a server asked during a streamed call.", "POST",
        "/calls/{call}/answers/{question}", ("answer",), "call_answer", takes_params=True,
        examples=("""capd answer CALL 1 --params '{"result": {"action": "decline"}}'""",)),
    OperatorCommand(
        "token-create", "Make a bearer token for the MCP front door over HTTP.", "POST",
        "/tokens", ("token", "create"), "token_create",
        options=(
            Option(("--profile",), "profile", "what the token reaches: a [profiles.NAME] of "
                   "capd.toml (read at each request)", target="body"),
            Option(("--allow",), "allow", "or exactly these capabilities (comma-separated)",
                   target="body"),
            Option(("--name",), "name", "a name for the logs and for revoke (default: the "
                   "profile's and a few letters)", target="body"),
            Option(("--channel",), "channel", "the conversation channel its holder speaks "
                   "from", target="body"),
            Option(("--ttl",), "ttl", "how long it lasts, e.g. 12h, 30d (default: until "
                   "revoked)", target="body"),
        ),
        render="token",
        examples=("capd token create --profile reader --ttl 30d --name ci-agent",
                  "capd token create --allow notes.search,notes.read --json | jq -r .token"),
        operator_only=TOKENS_ARE_THE_OPERATORS),
    OperatorCommand("token-list", "Bearer tokens: name, reach, state (never the token).",
                    "GET", "/tokens", ("token", "list"), "token_list", render="tokens",
                    operator_only=TOKENS_ARE_THE_OPERATORS,
                    examples=("capd token list", "capd token list --json")),
    OperatorCommand("token-revoke", "Revoke a bearer token: refused from its next request.",
                    "POST", "/tokens/{token}/revoke", ("token", "revoke"), "token_revoke",
                    operator_only=TOKENS_ARE_THE_OPERATORS,
                    examples=("capd token revoke ci-agent   # by name or id",)),
    OperatorCommand(
        "consent-grant", "Grant consent for operations, for a while, maybe one session.",
        "POST", "/consent", ("consent", "grant"), "consent_grant",
        options=(
            Option(("operations",), "operations", "the operations, e.g. vault.write",
                   positional=True, rest=True, target="body"),
            Option(("--session",), "session", "only for this agent session", target="body"),
            Option(("--ttl",), "ttl", "how long, e.g. 30m, 1h, 7d (default 1h)",
                   target="body"),
        ),
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
                    operator_only=CONSENT_IS_THE_OPERATORS,
                    examples=("capd consent revoke GRANT_ID   # the id from consent list",)),
    OperatorCommand("sessions", "Agent sessions loop detection is counting.", "GET",
                    "/sessions", ("sessions", "list"), "sessions_list",
                    operator_only=SESSIONS_ARE_THE_OPERATORS,
                    examples=("capd sessions list",)),
    OperatorCommand("sessions-reset", "Forget a session's loop counts (unblocks it).", "POST",
                    "/sessions/{session}/reset", ("sessions", "reset"), "sessions_reset",
                    operator_only=SESSIONS_ARE_THE_OPERATORS,
                    examples=("capd sessions reset 7f3a",)),
    OperatorCommand("recheck", "Re-probe a disabled capability's missing tools.", "POST",
                    "/recheck/{name}", ("recheck",), "recheck", options=(FORCE,),
                    examples=("capd recheck notes.publish",
                              "capd recheck notes.publish --force   # even within the cooldown"),
                    optional_mcp=McpTool(
                        "recheck",
                        "Re-probe a disabled capability's missing tools now and say what came "
                        "back: live is true when it was restored. Probes within the cooldown "
                        "are answered from the last result unless force is true.",
                        {"type": "object", "required": ["id"], "properties": {
                            "id": {"type": "string",
                                   "description": "The capability id, e.g. notes.publish."},
                            "force": {"type": "boolean",
                                      "description": "Probe even within the cooldown."}}},
                        path={"id": "name"}, query={"force": "force"})),
    OperatorCommand("recheck-tool", "Re-probe one tool and restore what it unblocks.", "POST",
                    "/recheck-tool/{tool}", ("recheck-tool",), "recheck_tool", options=(FORCE,),
                    examples=("capd recheck-tool sync_server --force",)),
    OperatorCommand("reload", "Full reload: config, declarations, plugins, probes.", "POST",
                    "/reload", ("reload",), "reload",
                    examples=("capd reload   # waits for the outcome; exit 1 says why it failed",
                              "systemctl reload capd   # the unit's ExecReload runs capd reload"),
                    optional_mcp=McpTool(
                        "reload",
                        "Reload capd fully (config, declarations, plugins, every probe) and "
                        "answer when it is done: ok, how long it took, and the error if it "
                        "failed (the previous registry then keeps serving).",
                        {"type": "object", "properties": {}})),
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
    OperatorCommand(
        "queue-purge", "Delete finished jobs of one state older than a duration.", "POST",
        "/queue/purge", ("queue", "purge"), "queue_purge",
        options=(
            Option(("--state",), "state", "done, partial, dead or cancelled",
                   choices=("done", "partial", "dead", "cancelled")),
            Option(("--older-than",), "older_than", "e.g. 7d, 12h, 30m (default 7d)"),
        ),
        examples=("capd queue purge --state done --older-than 7d",),
    ),
    OperatorCommand(
        "queue-list", "List retry jobs, newest first.", "GET", "/queue", ("queue", "list"),
        "queue_list",
        options=(Option(("--state",), "state", "only jobs in this state"),
                 Option(("--limit",), "limit", "at most this many (default 100)",
                        value="count")),
        render="jobs",
        examples=("capd queue list", "capd queue list --state needs_operator --limit 20"),
    ),
    OperatorCommand("queue-show", "One retry job with its attempts.", "GET", "/queue/{id}",
                    ("queue", "show"), "queue_show",
                    examples=("capd queue show JOB_ID   # the ID column of `capd queue list`",)),
    OperatorCommand("queue-retry", "Make a parked or dead job due now.", "POST",
                    "/queue/{id}/retry", ("queue", "retry"), "queue_retry",
                    examples=("capd queue retry JOB_ID",)),
    OperatorCommand("queue-cancel", "Cancel a job that is not running.", "POST",
                    "/queue/{id}/cancel", ("queue", "cancel"), "queue_cancel",
                    examples=("capd queue cancel JOB_ID",)),
    OperatorCommand("agent-list", "Agents declared in capd.toml, and the run-time injections.",
                    "GET", "/agents", ("agent", "list"), "agents_list", render="agents",
                    examples=("capd agent list", "capd agent list --json | jq '.injections'")),
    OperatorCommand("agent-show", "One agent's entries and what each selects now.", "GET",
                    "/agents/{agent}", ("agent", "show"), "agent_show", render="agent",
                    examples=("capd agent show reviewer",)),
    OperatorCommand(
        "agent-resolve", "The MCP servers an agent's runtime needs, in an execution context.",
        "GET", "/agents/{agent}/resolve", ("agent", "resolve"), "agent_resolve",
        options=(CONTEXT, Option(("--format",), "format", "json (everything; the default), "
                                 "claude (mcpServers) or codex (TOML)", choices=AGENT_FORMATS)),
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
                    "(roles, groups, phases). Then get_topology or expand_topology.",
                    {"type": "object", "properties": {}}),
    ),
    OperatorCommand(
        "topology-validate", "Check one topology, or all; exit 1 naming every problem.", "GET",
        "/topologies/validate", ("topology", "validate"), "topology_validate",
        options=(Option(("topology",), "id", "a topology id (default: every topology)",
                        positional=True, optional=True),),
        render="validation",
        examples=("capd topology validate   # every topology; exit 1 on any problem",
                  "capd topology validate review"),
    ),
    OperatorCommand(
        "topology-show", "One topology as declared, with the problems found in it.", "GET",
        "/topologies/{topology}", ("topology", "show"), "topology_show",
        examples=("capd topology show review",),
        mcp=McpTool("get_topology",
                    "One topology as declared: its roles (responsibilities, agent, count), "
                    "groups, phases (fanout, fanin), required evidence, and any problem.",
                    {"type": "object", "required": ["id"], "properties": {
                        "id": {"type": "string", "description": "The topology id."}}},
                    path={"id": "topology"}),
    ),
    OperatorCommand(
        "topology-expand", "Materialise a topology's instances, each with its agent's config.",
        "GET", "/topologies/{topology}/expand", ("topology", "expand"), "topology_expand",
        options=(Option(("--set",), "set", "ROLE.count=N: another count for a role (repeatable)",
                        repeat=True), CONTEXT),
        examples=("capd topology expand review",
                  "capd topology expand review --set reviewer.count=5 --context silent=true"),
        mcp=McpTool("expand_topology",
                    "Materialise a topology: every role instance (reviewer-1 ... reviewer-N "
                    "when count > 1) with its agent's capabilities and MCP server configs, "
                    "and the groups and phases by instance. Refuses an invalid topology.",
                    {"type": "object", "required": ["id"], "properties": {
                        "id": {"type": "string", "description": "The topology id."},
                        "set": {"type": "array", "items": {"type": "string"},
                                "description": "Count overrides, each ROLE.count=N."},
                        "context": {"type": "array", "items": {"type": "string"},
                                    "description": "The execution context, each key=value."}}},
                    path={"id": "topology"}, query={"set": "set", "context": "context"}),
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
