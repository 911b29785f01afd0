"""One trust boundary, tried as a restricted agent would: through the real daemon, the real
CLI, raw HTTP on the socket and the real bridge with the SDK client.

The restricted agent is this test process's own uid (root) run with one more
supplementary group, 4242, which ``[[peers]]`` binds to the profile ``reader``
(``setpriv --groups``): the daemon reads that group from the connection itself, so
the CLI and the bridge started that way are profile-bound callers, while the test
process, without the group, stays the operator.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from capd.sidecar.client._client import Response, request
from tests.helpers.daemon import DaemonProcess, daemons_on
from tests.helpers.peers import curl_as, open_up

pytestmark = pytest.mark.slow  # starts the real daemon, the CLI and the bridge

GROUP = 4242
VISIBLE = {"tb.echo", "tb.primary", "tb.private", "tb.peek", "tb.svc_read", "tb.note"}
AS_AGENT = ["setpriv", f"--groups={GROUP}", "--"]
SECRET = "SECRET-8d1f"

PACK = f'''
from pydantic import BaseModel
from capd.registry import op


class Text(BaseModel):
    text: str = "x"


class Line(BaseModel):
    line: str


@op("tb.echo")
async def echo(params: Text) -> str:
    return params.text


@op("tb.secret")
async def secret(params: Text) -> str:
    return "{SECRET}"


@op("tb.fails")
async def fails(params: Text) -> str:
    raise TimeoutError("upstream did not answer")


@op("tb.park")
async def park(params: Line) -> str:
    raise TimeoutError("the vault is away")


class Peek(BaseModel):
    link: str


@op("tb.note")
async def note(params: Line) -> str:
    raise TimeoutError("the notebook is away")


@op("tb.peek")
async def peek(params: Peek) -> str:
    return "peeked " + params.link
'''

CAPS = '''
[[capability]]
name = "tb.echo"
op = "tb.echo"
summary = "Echo text back."
tags = ["shared"]

[[capability]]
name = "tb.secret"
op = "tb.secret"
summary = "Read the operator's secret."
tags = ["shared"]
aliases = ["secret-reader"]

[[capability]]
name = "tb.primary"
op = "tb.fails"
summary = "A lookup that fails and falls back by itself."
tags = ["shared"]
auto_fallback = true

[[capability.on_error]]
error_type = "*"
try = ["tb.secret", "tb.echo"]

[[capability]]
name = "tb.private"
op = "tb.echo"
summary = "Read from the private channel only."
channels = ["private"]

[[capability]]
name = "tb.svc_read"
op = "tb.echo"
summary = "Read the service."
requires = ["svc"]

[[capability]]
name = "tb.svc_wipe"
op = "tb.echo"
summary = "Wipe the service."
requires = ["svc"]

[[capability]]
name = "tb.note"
op = "tb.note"
summary = "A write that fails for now and is retried."
mutates_state = true
retry_policy = "replay"

[[capability]]
name = "tb.peek"
op = "tb.peek"
summary = "Look at a link."

[[capability]]
name = "tb.park"
op = "tb.park"
summary = "A write the operator settles by hand."
mutates_state = true
retry_policy = "manual"
'''


def write_config(folder: Path, extra: str = "") -> Path:
    (folder / "tb_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(CAPS)
    config = folder / "capd.toml"
    config.write_text(textwrap.dedent(f"""
        plugins = ["tb_pack"]
        plugin_paths = ["."]
        declarations = ["caps.toml"]
        entry_points = false
        state_dir = "state"
        recheck_cooldown_s = 3600
        recheck_interval_s = 3600
        probe_live_interval_s = 3600

        [tools.svc]
        kind = "path"
        path = "{folder}/svc_flag"
        timeout_s = 1

        [[injections]]
        when = "incident"
        add = ["tb.secret"]
        why = "an incident needs the secret"

        [agents.helper]
        capabilities = ["tb.echo"]

        [policy]
        before = ["capd:ssrf_guard"]

        [policy.loops]
        enabled = false

        [mcp]
        operator_tools = ["reload", "recheck"]

        [profiles.reader]
        capabilities = ["tb.echo", "tb.primary", "tb.private", "tb.peek", "tb.svc_read",
                        "tb.note"]

        [profiles.other]
        capabilities = ["tb.secret"]

        [[peers]]
        gid = {GROUP}
        profile = "reader"
    """) + textwrap.dedent(extra))
    return config


@pytest.fixture
def tb(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("a second group for the agent needs root and setpriv (util-linux)")
    with daemons_on(short_tmp, write_config) as start:
        yield start


def agent_http(daemon: DaemonProcess, method: str, path: str,
               body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """A raw HTTP request on the socket from a process in the bound group (curl)."""
    data = ["--data", json.dumps(body), "-H", "Content-Type: application/json"] \
        if body is not None else []
    extra = [x for k, v in (headers or {}).items() for x in ("-H", f"{k}: {v}")]
    done = subprocess.run(
        [*AS_AGENT, shutil.which("curl") or "curl", "-s", "-X", method, "-w", "\n%{http_code}",
         *data, *extra, "--unix-socket", str(daemon.socket), f"http://capd{path}"],
        capture_output=True, text=True, timeout=30, check=False)
    text, _, status = done.stdout.rpartition("\n")
    try:
        parsed: Any = json.loads(text) if text else None
    except ValueError:
        parsed = text
    return int(status), parsed


def agent_cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, run in the bound group."""
    return subprocess.run([*AS_AGENT, sys.executable, "-m", "capd", *args, "--socket",
                           str(daemon.socket)], capture_output=True, text=True, timeout=60,
                          check=False)


def operator_cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capd", *args, "--socket", str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)


@asynccontextmanager
async def agent_bridge(socket: Path, *extra: str, group: bool = True
                       ) -> AsyncIterator[ClientSession]:
    """The real bridge (in the bound group unless ``group`` is False) and an SDK client."""
    argv = [sys.executable, "-m", "capd", "mcp", "--socket", str(socket), *extra]
    command, args = (AS_AGENT[0], [*AS_AGENT[1:], *argv]) if group else (argv[0], argv[1:])
    params = StdioServerParameters(command=command, args=args)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def parked_job(daemon: DaemonProcess) -> str:
    """A write parked for the operator (policy manual): its job id."""
    answer = request(daemon.socket, "POST", "/call/tb.park", body={"line": "a"})
    assert answer.status == 202, answer.body
    return str(answer.body["queued"])


# ------------------------------------------------------------------ operator rows


def test_a_profile_bound_caller_is_refused_every_operator_row(
        tb: Callable[..., DaemonProcess]) -> None:
    """Queue, reload, recheck-tool, status, metrics, consent and sessions are 403 with a
    sentence for a bound caller; the job it tried to retry or cancel is untouched."""
    daemon = tb()
    job = parked_job(daemon)
    for method, path, body in [
            ("GET", "/queue", None), ("GET", f"/queue/{job}", None),
            ("GET", "/queue/stats", None), ("POST", f"/queue/{job}/retry", {}),
            ("POST", f"/queue/{job}/cancel", {}), ("POST", "/queue/purge?state=done", {}),
            ("POST", "/reload", {}), ("POST", "/recheck-tool/x", {}), ("GET", "/status", None),
            ("GET", "/metrics", None), ("GET", "/consent", None), ("GET", "/sessions", None)]:
        status, answer = agent_http(daemon, method, path, body)
        assert status == 403, (path, answer)
        assert "operators only" in answer["detail"], answer
        assert "profile reader" in answer["detail"]
    assert request(daemon.socket, "GET", f"/queue/{job}").body["state"] == "needs_operator"
    refused = agent_cli(daemon, "queue", "list")
    assert refused.returncode != 0
    assert "operators only" in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr
    event = daemon.wait_event("operator_only_denied")
    assert event["grant"] == "agent, profile reader"


def test_an_operator_action_lands_in_the_audit_trail_with_its_actor(
        tb: Callable[..., DaemonProcess]) -> None:
    """capd queue retry writes who asked (uid, pid, grant) beside what it did."""
    daemon = tb()
    job = parked_job(daemon)
    done = operator_cli(daemon, "queue", "retry", job)
    assert done.returncode == 0, done.stderr
    trail = request(daemon.socket, "GET", f"/queue/{job}").body["trail"]
    operator = [a for a in trail if a["kind"] == "operator"]
    assert operator, trail
    assert f"by uid {os.geteuid()} pid " in operator[-1]["detail"]
    assert "(operator)" in operator[-1]["detail"]


def test_recheck_reaches_only_inside_the_grant_and_hidden_names_are_unknown(
        tb: Callable[..., DaemonProcess]) -> None:
    """Recheck of a capability inside the profile answers; outside it, by name, alias,
    @alias or percent-encoding, is the same 404 as a name never declared, naming nothing."""
    daemon = tb()
    assert agent_http(daemon, "POST", "/recheck/tb.echo", {})[0] == 200
    never, _ = agent_http(daemon, "POST", "/recheck/tb.nothing", {})
    assert never == 404
    for path in ["/recheck/tb.secret", "/call/secret-reader", "/call/@secret-reader",
                 "/call/%40secret-reader", "/call/tb.secret", "/capabilities/secret-reader",
                 "/capabilities/%40secret-reader"]:
        status, answer = agent_http(daemon, "POST" if "/capabilities" not in path else "GET",
                                    path, {} if "/capabilities" not in path else None)
        assert status == 404, (path, answer)
        if "secret-reader" in path:  # an alias never gives the canonical name away
            assert "tb.secret" not in json.dumps(answer), (path, answer)
        assert answer["title"] == "Unknown Capability"
        # suggestions come from what the grant reaches, hidden or unknown alike
        assert set(answer["suggestions"]) <= VISIBLE, answer
    near_hidden = agent_http(daemon, "POST", "/call/tb.secre", {})[1]
    near_unknown = agent_http(daemon, "POST", "/call/tb.secrex", {})[1]
    assert "tb.secret" not in near_hidden["suggestions"] + near_unknown["suggestions"]
    shown = agent_cli(daemon, "show", "@secret-reader")
    assert shown.returncode != 0
    assert "tb.secret" not in shown.stdout + shown.stderr
    # the operator, unrestricted, reaches it by every name
    assert request(daemon.socket, "POST", "/call/%40secret-reader", body={}).status == 200


def test_what_a_bound_caller_lists_and_searches_is_its_grant(
        tb: Callable[..., DaemonProcess]) -> None:
    """list, search, export, preflight and whoami show only what the profile holds."""
    daemon = tb()
    listed = json.loads(agent_cli(daemon, "list", "--json").stdout)
    assert {c["name"] for c in listed["capabilities"]} == VISIBLE
    found = json.loads(agent_cli(daemon, "search", "secret", "--json").stdout)
    assert all(r["name"] != "tb.secret" for r in found["results"])
    exported = json.loads(agent_cli(daemon, "export", "--format", "openai", "--json").stdout)
    assert SECRET not in json.dumps(exported)
    assert "tb__secret" not in json.dumps(exported)
    status, plan = agent_http(daemon, "POST", "/preflight", {"calls": [
        {"capability": "tb.secret", "params": {}}, {"capability": "tb.echo", "params": {}}]})
    assert status == 200
    assert [r["reason"] for r in plan["refused"]] == ["unknown"]
    assert plan["ready"] == [1]
    me = json.loads(agent_cli(daemon, "whoami", "--json").stdout)
    assert (me["role"], me["profile"], me["bound"]) == ("agent", "reader", True)
    assert GROUP in me["groups"]
    assert me["mcp"]["operator_tools"] == ["recheck"]  # reload is the operator's
    status, health = agent_http(daemon, "GET", "/health")
    assert status == 200
    assert "tb.secret" not in json.dumps(health)


def test_auto_fallback_never_answers_from_outside_the_grant(
        tb: Callable[..., DaemonProcess]) -> None:
    """tb.primary falls back to tb.secret first: for a bound caller it is skipped (and not
    named among the alternatives); tb.echo, inside the profile, answers."""
    daemon = tb()
    status, answer = agent_http(daemon, "POST", "/call/tb.primary", {"text": "hi"})
    assert status == 200, answer
    assert (answer["answered_by"], answer["result"]) == ("tb.echo", "hi")
    assert SECRET not in json.dumps(answer)
    operator = request(daemon.socket, "POST", "/call/tb.primary", body={"text": "hi"})
    assert (operator.body["answered_by"], operator.body["result"]) == ("tb.secret", SECRET)


def test_the_bridges_allow_list_holds_through_fallback_alternatives_and_preflight(
        tb: Callable[..., DaemonProcess]) -> None:
    """Under the operator's own uid, capd mcp --allow tb.primary: the daemon holds the bridge
    to the list, so the fallback chain, the alternatives and preflight_calls never reach or
    name tb.secret, and neither calling nor reading it by alias works."""
    daemon = tb()

    async def run() -> dict[str, Any]:
        async with agent_bridge(daemon.socket, "--allow", "tb.primary", group=False) as s:
            return {
                "call": await s.call_tool("invoke_capability",
                                          {"id": "tb.primary", "arguments": {"text": "hi"}}),
                "secret": await s.call_tool("invoke_capability",
                                            {"id": "@secret-reader", "arguments": {}}),
                "get": await s.call_tool("get_capability", {"id": "tb.secret"}),
                "plan": await s.call_tool("preflight_calls", {"calls": [
                    {"capability": "tb.secret", "params": {}}]}),
                "search": await s.call_tool("search_capabilities", {"query": "secret"}),
                "list": await s.call_tool("list_capabilities", {}),
            }

    got = asyncio.run(run())
    text = {k: json.dumps(v.model_dump(mode="json")) for k, v in got.items()}
    for key, dumped in text.items():
        assert SECRET not in dumped, key
    failed = got["call"].structured_content
    assert failed is not None
    assert failed["status"] == "error_transient"
    assert failed["answered_by"] is None
    assert "tb.secret" not in failed["alternatives"]
    assert got["secret"].is_error
    assert got["get"].is_error
    plan = got["plan"].structured_content
    assert plan is not None
    assert plan["refused"][0]["reason"] == "unknown"
    assert "did you mean" not in plan["refused"][0]["detail"]
    assert "tb.secret" not in text["search"]
    listed = got["list"].structured_content
    assert listed is not None
    assert [c["name"] for c in listed["capabilities"]] == ["tb.primary"]


def test_a_bound_caller_cannot_widen_its_grant(tb: Callable[..., DaemonProcess]) -> None:
    """A Capd-Grant naming tb.secret does not reach it for a bound caller (a narrowing only
    takes away); a bound bridge whose --allow names it refuses to start, saying so; a bound
    bridge is offered recheck (inside its grant) but never reload."""
    daemon = tb()
    status, _ = agent_http(daemon, "POST", "/call/tb.secret", {},
                           headers={"Capd-Grant": '{"allow": ["tb.secret"]}'})
    assert status == 404
    started = subprocess.run(
        [*AS_AGENT, sys.executable, "-m", "capd", "mcp", "--socket", str(daemon.socket),
         "--allow", "tb.echo,tb.secret"], input="", capture_output=True, text=True,
        timeout=60, check=False)
    assert started.returncode != 0
    assert "unknown capability 'tb.secret'" in started.stderr

    async def run() -> tuple[set[str], Any, Any]:
        async with agent_bridge(daemon.socket, "--allow", "tb.echo") as s:
            tools = {t.name for t in (await s.list_tools()).tools}
            echo = await s.call_tool("invoke_capability",
                                     {"id": "tb.echo", "arguments": {"text": "ok"}})
            recheck = await s.call_tool("recheck", {"id": "tb.secret"})
            return tools, echo, recheck

    tools, echo, recheck = asyncio.run(run())
    assert "recheck" in tools
    assert "reload" not in tools
    assert echo.structured_content is not None
    assert echo.structured_content["result"] == "ok"
    assert recheck.is_error
    assert "Unknown Capability" in json.dumps(recheck.model_dump(mode="json"))


# ------------------------------------------------------------- the connection's grant


FD_PASSING = '''
import os, socket, sys, time

# The connector connects, hands the connection to a child and exits; this process reaps
# it (so nothing of it is left in /proc), and only then does the child use the connection.
reaped = os.pipe()
connector = os.fork()
if connector == 0:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(sys.argv[1])
    if os.fork() == 0:
        os.close(reaped[1])
        os.read(reaped[0], 1)  # until the connector has been reaped
        for name in ("tb.secret", "tb.echo"):
            sock.sendall(b"POST /call/" + name.encode() + b" HTTP/1.1\\r\\nHost: capd\\r\\n"
                         b"Content-Type: application/json\\r\\nContent-Length: 2\\r\\n\\r\\n{}")
            data = b""
            while b"\\r\\n\\r\\n" not in data:
                data += sock.recv(65536)
            head, _, rest = data.partition(b"\\r\\n\\r\\n")
            lines = head.split(b"\\r\\n")
            length = int([h for h in lines if h.lower().startswith(b"content-length")][0]
                         .split(b":")[1])
            while len(rest) < length:
                rest += sock.recv(65536)
            print(head.split(b" ")[1].decode(), flush=True)
        os._exit(0)
    os._exit(0)
os.waitpid(connector, 0)
gone = not os.path.exists(f"/proc/{connector}")
os.write(reaped[1], b"x")
print("reaped" if gone else "not reaped", flush=True)
os.wait()
'''


def test_a_gid_binding_holds_after_the_connecting_process_exits(
        tb: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """The process in the bound group connects, hands the connection to a child and exits,
    and is reaped; the child, calling after that, is still restricted (the groups came
    with the connection, not from /proc later)."""
    daemon = tb()
    script = short_tmp / "fd_passing.py"
    script.write_text(FD_PASSING)
    done = subprocess.run([*AS_AGENT, sys.executable, str(script), str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.split() == ["reaped", "404", "200"], (done.stdout, done.stderr)


def test_a_revoked_group_and_a_revoked_operator_lose_access_at_reload(
        tb: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """Taking the binding away (or adding one) takes effect at the next reload, on the
    peer's next request; so does a change of operator_uids."""
    daemon = tb()
    assert agent_http(daemon, "POST", "/call/tb.secret", {})[0] == 404
    config = short_tmp / "capd.toml"
    config.write_text(config.read_text().replace(f"gid = {GROUP}", "gid = 4243"))
    assert request(daemon.socket, "POST", "/reload").status == 200
    assert agent_http(daemon, "POST", "/call/tb.secret", {})[0] == 200
    assert agent_http(daemon, "GET", "/queue")[0] == 200  # root, unbound: an operator again
    config.write_text(config.read_text().replace("gid = 4243", f"gid = {GROUP}"))
    assert request(daemon.socket, "POST", "/reload").status == 200
    assert agent_http(daemon, "POST", "/call/tb.secret", {})[0] == 404
    assert agent_http(daemon, "GET", "/queue")[0] == 403


def test_a_peer_whose_groups_cannot_be_read_is_refused_not_let_in_unbound() -> None:
    """Unit: with a gid binding, unreadable groups refuse the peer (fail closed)."""
    from capd.sidecar.server._authority import Authority, PeerBinding, PeerRefused
    from capd.sidecar.server._gateway import Caller
    from capd.sidecar.server._grant import Profile

    authority = Authority(own_uid=0, profiles={"reader": Profile("reader", ("tb.echo",))},
                          bindings=[PeerBinding("reader", gid=GROUP)])
    with pytest.raises(PeerRefused):
        authority.grant_for(Caller(pid=7, uid=0, gid=0, groups=None))


# --------------------------------------------------------------------------- channels


def test_a_channel_capability_runs_only_for_its_channel(
        tb: Callable[..., DaemonProcess]) -> None:
    """tb.private declares channels = ["private"]: a caller with no channel or another one
    is error_blocked wrong_channel; an unbound caller naming private runs it; a caller
    bound to a channel, or bound with none, cannot claim another."""
    daemon = tb(extra="""
        [[peers]]
        gid = 4244
        channel = "team"
    """)
    none = request(daemon.socket, "POST", "/call/tb.private", body={})
    assert (none.status, none.body["error_type"]) == (403, "wrong_channel")
    assert "names no channel" in none.body["message"]
    assert "--channel" in none.body["message"]
    private = request(daemon.socket, "POST", "/call/tb.private", body={},
                      headers={"Capd-Grant": '{"channel": "private"}'})
    assert (private.status, private.body["status"]) == (200, "success")
    other = request(daemon.socket, "POST", "/call/tb.private", body={},
                    headers={"Capd-Grant": '{"channel": "public"}'})
    assert other.body["error_type"] == "wrong_channel"
    status, answer = agent_http(daemon, "POST", "/call/tb.private", {},
                                headers={"Capd-Grant": '{"channel": "private"}'})
    assert status == 403, answer  # bound by gid 4242 with no channel: it cannot name one
    assert "bound to no channel" in answer["detail"]
    done = subprocess.run(["setpriv", "--groups=4244", "--", shutil.which("curl") or "curl",
                           "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                           "-H", 'Capd-Grant: {"channel": "private"}', "--data", "{}",
                           "--unix-socket", str(daemon.socket), "http://capd/call/tb.echo"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout == "403"  # bound to channel team: cannot speak from private


async def _bridge_channel(socket: Path) -> Any:
    async with agent_bridge(socket, "--channel", "private", group=False) as session:
        return await session.call_tool("invoke_capability", {"id": "tb.private"})


def test_the_bridge_carries_its_channel(tb: Callable[..., DaemonProcess]) -> None:
    """capd mcp --channel private runs a private-channel capability; without it, refused."""
    daemon = tb()
    answer = asyncio.run(_bridge_channel(daemon.socket))
    assert answer.structured_content is not None
    assert answer.structured_content["status"] == "success"


# ------------------------------------------------------------------------------- loops


def call(daemon: DaemonProcess, name: str, session: str | None = None) -> Response:
    headers = {"Capd-Session": session} if session else None
    return request(daemon.socket, "POST", f"/call/{name}", body={"text": "same"},
                   headers=headers)


def test_require_session_refuses_a_call_without_one(tb: Callable[..., DaemonProcess]) -> None:
    """[policy.loops] require_session = true: no Capd-Session is error_blocked
    session_required; with one the call runs."""
    daemon = tb(extra="")
    config = Path(daemon.config).read_text()
    Path(daemon.config).write_text(config.replace("enabled = false", "require_session = true"))
    assert request(daemon.socket, "POST", "/reload").status == 200
    bare = call(daemon, "tb.echo")
    assert (bare.status, bare.body["error_type"]) == (403, "session_required")
    assert call(daemon, "tb.echo", session="s1").status == 200


# ------------------------------------------------------------------------------- SSRF


def test_a_url_under_any_key_is_refused_on_every_surface(
        tb: Callable[..., DaemonProcess]) -> None:
    """tb.peek takes `link` (not a key named like a URL): an inside address in it is refused
    through raw HTTP, the real CLI and the real bridge alike; the op never runs."""
    daemon = tb()
    inside = "http://127.0.0.1:9/admin"
    status, answer = agent_http(daemon, "POST", "/call/tb.peek", {"link": inside})
    assert (status, answer["status"]) == (403, "error_blocked"), answer
    assert "link" in answer["message"]
    done = agent_cli(daemon, "call", "tb.peek", "-p", f"link={inside}")
    assert done.returncode != 0
    assert "loopback" in done.stderr

    async def run() -> Any:
        async with agent_bridge(daemon.socket) as session:
            return await session.call_tool("invoke_capability", {
                "id": "tb.peek", "arguments": {"link": "http://0x7f.1/"}})

    bridged = asyncio.run(run())
    assert bridged.is_error
    assert bridged.structured_content is not None
    assert bridged.structured_content["status"] == "error_blocked"
    assert "peeked" not in json.dumps(bridged.model_dump(mode="json"))


# ------------------------------------------------------------- revocation by uid


def test_a_uid_taken_out_of_allow_uids_is_refused_after_reload(
        tb: Callable[..., DaemonProcess], short_tmp: Path, peer_uid: int) -> None:
    """allow_uids and operator_uids are re-read at reload: an operator uid loses the queue,
    then an allowed uid loses the socket, on their next request."""
    config = f"allow_uids = [{peer_uid}]\noperator_uids = [{peer_uid}]\n"
    daemon = tb()
    path = short_tmp / "capd.toml"
    path.write_text(config + path.read_text())
    assert request(daemon.socket, "POST", "/reload").status == 200
    open_up(daemon)
    assert curl_as(peer_uid, daemon.socket, "/queue") == "200"
    path.write_text(path.read_text().replace(f"operator_uids = [{peer_uid}]\n", ""))
    assert request(daemon.socket, "POST", "/reload").status == 200
    assert curl_as(peer_uid, daemon.socket, "/queue") == "403"
    assert curl_as(peer_uid, daemon.socket, "/capabilities") == "200"
    path.write_text(path.read_text().replace(f"allow_uids = [{peer_uid}]\n", ""))
    assert request(daemon.socket, "POST", "/reload").status == 200
    assert curl_as(peer_uid, daemon.socket, "/capabilities") == "403"


# ----------------------------------------------------------- what the review found


def test_recheck_names_only_what_the_grant_reaches_and_force_is_the_operators(
        tb: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """tb.svc_read and the hidden tb.svc_wipe share a tool: an agent's recheck restores
    what the tool unblocks but names only tb.svc_read; --force is refused to it."""
    daemon = tb()
    (short_tmp / "svc_flag").touch()
    status, forced = agent_http(daemon, "POST", "/recheck/tb.svc_read?force=true", {})
    assert status == 403, forced
    assert "operators only" in forced["detail"]
    status, answer = agent_http(daemon, "POST", "/recheck/tb.svc_read", {})
    assert status == 200, answer
    assert answer["state"] == "live"
    assert "tb.svc_wipe" not in json.dumps(answer)
    assert answer["restored"] == ["tb.svc_read"]


def test_injections_and_contexts_outside_the_grant_are_not_shown(
        tb: Callable[..., DaemonProcess]) -> None:
    """An injection adding a hidden capability is left out of an agent's listings, and a
    context that would trigger it resolves without it rather than failing."""
    daemon = tb()
    status, agents = agent_http(daemon, "GET", "/agents")
    assert status == 200
    assert agents["injections"] == []
    assert "tb.secret" not in json.dumps(agents)
    assert len(request(daemon.socket, "GET", "/agents").body["injections"]) == 1
    status, resolved = agent_http(daemon, "GET", "/agents/helper/resolve?context=incident")
    assert status == 200, resolved
    assert resolved["capabilities"] == ["tb.echo"]


def test_an_agents_idempotency_keys_are_its_own(tb: Callable[..., DaemonProcess]) -> None:
    """The operator's queued write under key K does not answer an agent's write under K
    (no 409 naming the operator's job or capability): each writes its own job."""
    daemon = tb()
    key = {"Idempotency-Key": "deploy-2026-11-25", "Capd-Timeout": "0.5"}
    mine = request(daemon.socket, "POST", "/call/tb.park", body={"line": "a"}, headers=key)
    assert mine.status == 202, mine.body
    status, theirs = agent_http(daemon, "POST", "/call/tb.note", {"line": "b"}, headers=key)
    assert status == 202, theirs
    assert theirs["queued"] != mine.body["queued"]
    assert "tb.park" not in json.dumps(theirs)
    again = agent_http(daemon, "POST", "/call/tb.note", {"line": "b"}, headers=key)[1]
    assert again["queued"] == theirs["queued"]  # the agent's own key still de-duplicates


def test_an_agent_cannot_read_another_profile_or_the_operators_troubles(
        tb: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """export ?profile= of another profile is unknown to an agent, naming no profile but its
    own; /health tells it a reload failed but not why (file names, lines)."""
    daemon = tb()
    status, answer = agent_http(daemon, "GET", "/export?format=openai&profile=other")
    assert status == 404, answer
    assert answer["detail"] == "unknown profile 'other' (profiles: reader)"
    config = short_tmp / "capd.toml"
    good = config.read_text()
    config.write_text(good + "\nthis is not toml [\n")
    assert request(daemon.socket, "POST", "/reload").status == 500
    status, health = agent_http(daemon, "GET", "/health")
    assert "capd.toml" not in json.dumps(health)
    assert "reload:last" not in health["checks"]
    assert "the last reload failed" in health["output"]
    assert "reload:last" in request(daemon.socket, "GET", "/health").body["checks"]
    config.write_text(good)


LOOPS = """
    [policy.loops]
    enabled = true
    warn_at = 3
    block_at = 5
"""


def test_an_agent_escapes_no_loop_count_by_new_processes_or_new_sessions(
        tb: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """Each curl is a new process with no session: a bound agent is still counted as one;
    and making up a new session name for every call starts no fresh count either."""
    daemon = tb()
    config = short_tmp / "capd.toml"
    config.write_text(config.read_text().replace("[policy.loops]\nenabled = false\n", "")
                      + LOOPS)
    assert request(daemon.socket, "POST", "/reload").status == 200
    bare = [agent_http(daemon, "POST", "/call/tb.echo", {"text": "same"})[0]
            for _ in range(5)]
    assert bare == [200, 200, 200, 200, 403]
    rotated = [agent_http(daemon, "POST", "/call/tb.peek", {"link": "plain words"},
                          headers={"Capd-Session": f"r{i}"})[0] for i in range(5)]
    assert rotated == [200, 200, 200, 200, 403]


def test_a_grant_header_sent_twice_is_refused(tb: Callable[..., DaemonProcess]) -> None:
    """Two Capd-Grant (or Capd-Session) headers: 400, not whichever the server reads last."""
    daemon = tb()
    done = subprocess.run(
        [shutil.which("curl") or "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
         "-X", "POST", "--data", "{}", "-H", 'Capd-Grant: {"allow": ["tb.echo"]}',
         "-H", 'Capd-Grant: {"allow": ["tb.secret"]}', "--unix-socket", str(daemon.socket),
         "http://capd/call/tb.echo"], capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout == "400"
