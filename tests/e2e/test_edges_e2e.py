"""Edges a hostile caller cannot move, through the real daemon as real uids: globs never
match through an alias, an unbound agent's idempotency keys are its own, /health's
detail is the operator's, and the SSRF guard reads scheme-relative and wrapped URLs."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess, FlipServer, daemons_on, write_e2e_config
from tests.helpers.peers import open_up

pytestmark = pytest.mark.slow  # the real daemon, curl under other uids and groups

GROUP = 4545

CAPS = '''
[[capability]]
name = "shell.exec"
op = "e2e.echo"
summary = "Run a shell command (a pack's own)."
aliases = ["notes.exec"]

[[capability]]
name = "notes.read"
op = "e2e.echo"
summary = "Read a note."

[[capability]]
name = "broken.one"
op = "e2e.no_such_op"
summary = "A declaration with an error."
'''


@pytest.fixture
def up(short_tmp: Path, web: FlipServer) -> Iterator[Callable[..., DaemonProcess]]:
    if shutil.which("setpriv") is None or shutil.which("curl") is None:
        pytest.skip("needs setpriv and curl")

    def write(folder: Path, extra: str) -> Path:
        config = write_e2e_config(folder, web.port)
        (folder / "caps.toml").write_text((folder / "caps.toml").read_text() + CAPS)
        config.write_text(config.read_text() + '\n[policy]\nbefore = ["capd:ssrf_guard"]\n'
                          + extra)
        return config

    with daemons_on(short_tmp, write) as start:
        yield start


def as_peer(daemon: DaemonProcess, who: list[str], method: str, path: str,
            body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """curl on the socket as ``who`` (setpriv arguments): (status, the JSON body)."""
    data = ["--data", json.dumps(body), "-H", "Content-Type: application/json"] \
        if body is not None else []
    extra = [x for k, v in (headers or {}).items() for x in ("-H", f"{k}: {v}")]
    done = subprocess.run(
        ["setpriv", *who, "--", shutil.which("curl") or "curl", "-s", "-X", method,
         "-w", "\n%{http_code}", *data, *extra, "--unix-socket", str(daemon.socket),
         f"http://capd{path}"], capture_output=True, text=True, timeout=30, check=False)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text) if text else None


def test_a_glob_never_matches_through_an_alias(up: Callable[..., DaemonProcess],
                                               peer_uid: int) -> None:
    """A profile of notes.* admits notes.read but not shell.exec aliased notes.exec, by
    either name (the same 404 as unknown); a profile naming notes.exec exactly admits it."""
    daemon = up(f"""
[profiles.notes]
capabilities = ["notes.*"]
[profiles.exact]
capabilities = ["notes.exec"]
[[peers]]
uid = {peer_uid}
profile = "notes"
[[peers]]
gid = {GROUP}
profile = "exact"
""")
    open_up(daemon)
    globbed = [f"--reuid={peer_uid}", f"--regid={peer_uid}", "--clear-groups"]
    assert as_peer(daemon, globbed, "POST", "/call/notes.read", {"text": "a"})[0] == 200
    for name in ("notes.exec", "shell.exec", "@notes.exec"):
        status, body = as_peer(daemon, globbed, "POST", f"/call/{name}", {"text": "a"})
        assert status == 404, (name, body)
        assert "shell.exec" not in json.dumps(body).replace(repr(name), "")
        assert set(body["suggestions"]) <= {"notes.read"}  # only what it may see
    listed = as_peer(daemon, globbed, "GET", "/capabilities")[1]
    assert "shell.exec" not in json.dumps(listed)
    exact = [f"--groups={GROUP}"]
    status, body = as_peer(daemon, exact, "POST", "/call/notes.exec", {"text": "b"})
    assert status == 200, body


def test_an_unbound_agents_keys_and_health_are_its_own(up: Callable[..., DaemonProcess],
                                                       peer_uid: int) -> None:
    """An allow_uids uid (an agent) reusing the operator's Idempotency-Key gets a job of
    its own, and its 409 names only its own job; its /health carries no operator detail
    (declaration errors, every caller's jobs), the operator's does."""
    daemon = up()
    config = Path(daemon.config)
    config.write_text(f"allow_uids = [{peer_uid}]\n" + config.read_text())
    assert daemon.call("POST", "/reload").status == 200
    open_up(daemon)
    agent = [f"--reuid={peer_uid}", f"--regid={peer_uid}", "--clear-groups"]
    key = {"Idempotency-Key": "order-42"}
    mine = daemon.call("POST", "/call/e2e.flaky", {"text": "root's"}, headers=key)
    assert mine.status == 202, mine.body
    status, theirs = as_peer(daemon, agent, "POST", "/call/e2e.flaky", {"text": "root's"},
                             headers=key)
    assert status == 202, theirs
    assert theirs["queued"] != mine.body["queued"]
    status, conflict = as_peer(daemon, agent, "POST", "/call/e2e.flaky", {"text": "other"},
                               headers=key)
    assert status == 409, conflict
    assert mine.body["queued"] not in json.dumps(conflict)

    operator = daemon.call("GET", "/health").body
    assert "declarations:errors" in operator["checks"]
    assert "queue:jobs" in operator["checks"]
    status, health = as_peer(daemon, agent, "GET", "/health")
    assert status == 200
    assert "declarations:errors" not in health["checks"]
    assert "queue:jobs" not in health["checks"]
    assert "no_such_op" not in json.dumps(health)


@pytest.mark.parametrize(("url", "refused"), [
    ("//127.0.0.1/admin", True),
    ("//localhost:9/x", True),
    ("jar:http://127.0.0.1/x!/", True),
    ("view-source:http://169.254.169.254/latest/meta-data/", True),
    ("//2130706433/admin", True),
    ("//0x7f000001/", True),
    ("//metadata/computeMetadata/v1/", True),
    ("//2130706433\\admin", True),
    ("// a comment, not a URL", False),
    ("//todo", False),
])
def test_the_ssrf_guard_reads_scheme_relative_and_wrapped_urls(
        up: Callable[..., DaemonProcess], url: str, refused: bool) -> None:
    """A scheme-relative URL and a URL wrapped in another scheme are read as the URL
    they reach: an inside address is refused; a comment is not a URL."""
    daemon = up()
    answer = daemon.call("POST", "/call/e2e.echo", {"text": url})
    if refused:
        assert answer.status == 403, answer.body
        assert answer.body["error_type"] == "blocked"
    else:
        assert answer.status == 200, answer.body


def test_an_agents_context_says_what_it_does() -> None:
    """agent.NAME's schema no longer claims its context selects injections (it does not:
    the caller's context goes to the engine only)."""
    from capd.sidecar.server._engines import AgentTask

    described = AgentTask.model_json_schema()["properties"]["context"]["description"]
    assert "selects no injections" in described


def test_a_restricted_callers_scores_do_not_move_with_what_it_cannot_see(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A profile-bound caller's search scores are the same before and after capabilities
    it cannot see (and that match its query better) are added; the operator's move."""
    daemon = up(f"""
[profiles.notes]
capabilities = ["notes.*"]
[[peers]]
gid = {GROUP}
profile = "notes"
""")
    bound = [f"--groups={GROUP}"]

    def scores(who: list[str] | None) -> list[tuple[str, float]]:
        path = "/search?q=read%20a%20note&k=5"
        body = as_peer(daemon, who, "GET", path)[1] if who else daemon.call("GET", path).body
        return [(r["name"], r["score"]) for r in body["results"]]

    before, operator_before = scores(bound), scores(None)
    assert [name for name, _ in before] == ["notes.read"]
    (short_tmp / "more.toml").write_text("".join(
        f'[[capability]]\nname = "hidden.read_note_{i}"\nop = "e2e.echo"\n'
        f'summary = "Read a note, read a note: note reading {i}."\n\n' for i in range(30)))
    config = Path(daemon.config)
    config.write_text(config.read_text().replace(
        'declarations = ["caps.toml"]', 'declarations = ["caps.toml", "more.toml"]'))
    assert daemon.call("POST", "/reload").status == 200
    assert scores(bound) == before
    assert scores(None) != operator_before
