"""The CLI behaves like the tools operators know: --version, completion, help with examples,
unquoted search words, tables, quiet pipes, error sentences, a quiet Ctrl-C.

Each runs the real `capd` as a subprocess, against the real daemon where it needs one.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from capd.sidecar.client.cli import make_parser
from tests.helpers.daemon import DaemonProcess, FlipServer, Start

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes

CAPD = [sys.executable, "-m", "capd"]


def capd(*args: str, socket: Path | None = None) -> subprocess.CompletedProcess[str]:
    tail = ["--socket", str(socket)] if socket else []
    return subprocess.run([*CAPD, *args, *tail], capture_output=True, text=True, timeout=60,
                          check=False)


# ------------------------------------------------------------------ --version, completion


def test_version_prints_the_name_and_version() -> None:
    """`capd --version` prints `capd <version>` and exits 0."""
    done = capd("--version")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"capd {importlib.metadata.version('capd')}\n"


def bash(script: str) -> subprocess.CompletedProcess[str]:
    command = " ".join(shlex.quote(part) for part in CAPD)
    return subprocess.run(["bash", "-c", f"source <({command} completion bash)\n{script}"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_bash_completion_registers_capd_and_completes_nested_commands() -> None:
    """The bash script registers `complete -F … capd` and completes commands and options."""
    done = bash(textwrap.dedent("""
        complete -p capd
        reply() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _shtab_capd; echo "${COMPREPLY[*]}"; }
        reply capd que
        reply capd queue li
        reply capd search --inc
        reply capd call notes.append --par
    """))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("complete ")
    assert lines[0].endswith(" capd")
    assert lines[1:] == ["queue", "list", "--include-disabled", "--params"]


def test_names_complete_from_the_daemon_cached_and_quiet_when_it_is_down(
        start: Start, tmp_path: Path) -> None:
    """`capd show <TAB>` offers the daemon's capability names, `capd queue show <TAB>` its job
    ids, `capd recheck-tool <TAB>` its tools; when the daemon is down the last names known
    are offered, and with none known nothing is printed, at once and without an error."""
    import os

    daemon = start()
    queued = daemon.call("POST", "/call/e2e.flaky", {"text": "w"}).body["queued"]
    env = {**os.environ, "CAPD_SOCKET": str(daemon.socket), "XDG_CACHE_HOME": str(tmp_path)}
    command = " ".join(shlex.quote(part) for part in CAPD)
    script = textwrap.dedent(f"""
        capd() {{ {command} "$@"; }}   # the script runs `capd __complete`: this capd
        source <(capd completion bash)
        reply() {{
          COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _shtab_capd; echo "${{COMPREPLY[*]}}"
        }}
        reply capd show e2e.ec
        reply capd queue show ''
        reply capd recheck-tool w
    """)

    def run() -> list[str]:
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              timeout=60, env=env, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        return done.stdout.splitlines()

    assert run() == ["e2e.echo", queued, "web"]
    daemon.kill()
    assert run() == ["e2e.echo", queued, "web"]  # the cache, the daemon being down
    started = time.monotonic()
    done = subprocess.run([*CAPD, "__complete", "capabilities"], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**env, "XDG_CACHE_HOME": str(tmp_path / "empty")})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("shell", "marker"), [
    ("bash", "_shtab_capd_subparsers="),
    ("zsh", "#compdef capd"),
    ("fish", "complete -c capd"),
])
def test_every_shell_script_names_the_subcommands_and_their_options(shell: str, marker: str
                                                                   ) -> None:
    """Each script is generated from the parser: table rows, local commands, options."""
    done = capd("completion", shell)
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout
    for word in ("queue", "call", "install-units", "recheck-tool", "include-disabled",
                 "params", "older-than"):
        assert word in done.stdout, (shell, word)


def test_completion_of_an_unknown_shell_is_a_usage_error() -> None:
    """`capd completion tcsh` exits 2 naming the shells there are."""
    done = capd("completion", "tcsh")
    assert done.returncode == 2
    assert "choose from 'bash', 'zsh', 'fish'" in done.stderr


# ------------------------------------------------------------------ --help


def _subparsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subparsers(sub, (*path, name))


def test_every_subcommand_help_has_a_description_and_examples() -> None:
    """Every subcommand and group, table row or local, describes itself and shows examples."""
    seen = []
    for path, sub in _subparsers(make_parser()):
        text = sub.format_help()
        assert sub.description, path
        assert "\nExamples:\n  " in text, path
        examples = text.split("\nExamples:\n", 1)[1].splitlines()
        assert examples, path
        assert all(f"capd {path[0]}" in line for line in examples), (path, examples)
        seen.append(path)
    assert ("queue", "purge") in seen
    assert ("install-units",) in seen


def test_call_help_shows_how_to_pass_parameters() -> None:
    """`capd call --help` (a real process) shows -p key=value, -p key:=json and --params."""
    done = capd("call", "--help")
    assert done.returncode == 0, done.stderr
    examples = done.stdout.split("Examples:\n", 1)[1]
    assert '-p note=welcome -p "line=hello from capd"' in examples
    assert "-p limit:=3" in examples
    assert """--params '{"note": "todo", "title": "To do"}'""" in examples
    assert "Call a capability with JSON parameters." in done.stdout


# ------------------------------------------------------------------ search


def test_search_takes_the_query_as_the_remaining_words(start: Start) -> None:
    """`capd search echo the plugin version` sends the words joined, no quotes needed."""
    daemon = start()
    done = capd("search", "echo", "the", "plugin", "version", "--json", socket=daemon.socket)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["query"] == "echo the plugin version"
    assert body["results"][0]["name"] == "e2e.echo"


def test_search_prints_a_table_with_a_header_and_relevance(start: Start) -> None:
    """In a table: a header line, then relevance in [0, 1] (or `exact`), state, name, summary
    per hit, even for hits whose fused score is below 0; `-o wide` adds the raw score."""
    daemon = start()
    done = capd("search", "echo", "text", "-k", "2", socket=daemon.socket)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["RELEVANCE", "STATE", "CAPABILITY", "SUMMARY"]
    assert len(rows) == 2
    relevance, state, name, *summary = rows[0].split()
    assert 0 < float(relevance) <= 1
    assert (state, name) == ("live", "e2e.echo")
    assert " ".join(summary) == "Echo text and the plugin version."
    every = daemon.call("GET", "/search?q=echo+text&k=8").body["results"]
    assert any(hit["score"] < 0 for hit in every)  # the raw fused score can be negative...
    assert all(0 <= hit["relevance"] <= 1 for hit in every)  # ...relevance never is
    table = capd("search", "echo", "text", "-k", "8", socket=daemon.socket).stdout.splitlines()
    assert all(0 <= float(row.split()[0]) <= 1 for row in table[1:])
    wide = capd("search", "echo", "text", "-k", "2", "-o", "wide", socket=daemon.socket)
    assert wide.stdout.splitlines()[0].split() == [
        "RELEVANCE", "SCORE", "STATE", "CAPABILITY", "LATENCY", "TAGS", "SUMMARY"]
    exact = capd("search", "e2e.slow", socket=daemon.socket)
    assert exact.stdout.splitlines()[1].split()[:3] == ["exact", "live", "e2e.slow"]
    as_json = capd("search", "echo", "text", "-k", "2", "--json", socket=daemon.socket)
    assert json.loads(as_json.stdout) == daemon.call("GET", "/search?q=echo+text&k=2").body


def test_json_when_piped_tables_when_asked_and_columns_aligned(start: Start) -> None:
    """Piped with nothing asked, an answer is JSON (the HTTP body), a failure's sentence
    still on stderr; `-o table` aligns every column (the queue's DETAIL included);
    `-o yaml` is the same body; `show` in a table is fields, not JSON."""
    import os

    import yaml

    daemon = start()
    for text in ("w", "a longer one"):
        daemon.call("POST", "/call/e2e.flaky", {"text": text})
    env = {k: v for k, v in os.environ.items() if k != "CAPD_OUTPUT"}

    def piped(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CAPD, *args, "--socket", str(daemon.socket)],
                              capture_output=True, text=True, timeout=60, env=env, check=False)

    listed = piped("list")
    assert json.loads(listed.stdout) == daemon.call("GET", "/capabilities").body
    missing = piped("show", "e2e.nope")
    assert missing.returncode == 1
    assert json.loads(missing.stdout)["status"] == 404
    assert "unknown capability" in missing.stderr.lower()
    assert yaml.safe_load(piped("queue", "list", "-o", "yaml").stdout) == daemon.call(
        "GET", "/queue").body
    jobs = piped("queue", "list", "-o", "table").stdout.splitlines()
    assert jobs[0].split() == ["ID", "STATE", "TRIES", "CAPABILITY", "DETAIL"]
    start_of = jobs[0].index("DETAIL")
    assert all(row[start_of:].startswith("the backend is busy") for row in jobs[1:])
    assert jobs[0].index("CAPABILITY") == jobs[1].index("e2e.flaky")
    shown = piped("show", "e2e.echo", "-o", "table").stdout.splitlines()
    assert "name: e2e.echo" in shown
    bad = subprocess.run([*CAPD, "list", "--socket", str(daemon.socket)], capture_output=True,
                         text=True, timeout=60, env={**env, "CAPD_OUTPUT": "xml"}, check=False)
    assert bad.returncode == 2
    assert "CAPD_OUTPUT='xml'" in bad.stderr


# ------------------------------------------------------------------ pipes

BIG_PACK = '''
from pydantic import BaseModel
from capd.registry import op


class Text(BaseModel):
    text: str = "x"


@op("big.echo")
def echo(params: Text) -> str:
    return params.text
'''


@pytest.fixture
def big_daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    """A daemon with 1500 capabilities: `capd list` prints ~100 KiB, more than a pipe holds."""
    (short_tmp / "big_pack.py").write_text(BIG_PACK)
    (short_tmp / "caps.toml").write_text("".join(
        f'[[capability]]\nname = "big.cap{i:04d}"\nop = "big.echo"\n'
        f'summary = "Capability {i} of a list long enough to fill a pipe."\n\n'
        for i in range(1500)))
    config = short_tmp / "capd.toml"
    config.write_text('plugins = ["big_pack"]\nplugin_paths = ["."]\n'
                      'declarations = ["caps.toml"]\nentry_points = false\n'
                      'state_dir = "state"\n')
    daemon = DaemonProcess(config, short_tmp / "capd.sock").start()
    try:
        yield daemon.wait_ready()
    finally:
        daemon.kill()


@pytest.mark.parametrize("args", [("list",), ("list", "--json")])
def test_output_into_head_stops_quietly(big_daemon: DaemonProcess, args: tuple[str, ...]
                                        ) -> None:
    """`capd list | head -1`: one line out, capd exits 0 or 141, nothing on stderr."""
    producer = subprocess.Popen([*CAPD, *args, "--socket", str(big_daemon.socket)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert producer.stdout is not None
    head = subprocess.run(["head", "-1"], stdin=producer.stdout, capture_output=True,
                          text=True, timeout=60, check=False)
    producer.stdout.close()  # only head holds the read end now
    _, stderr = producer.communicate(timeout=60)
    assert head.stdout.count("\n") == 1
    assert head.stdout.split()[:1] in (["STATE"], ["{"])
    assert producer.returncode in (0, 141)
    assert stderr == b""


def test_help_into_head_stops_quietly() -> None:
    """`capd --help | head -1` leaves nothing on stderr either."""
    done = subprocess.run(["bash", "-c", f"{shlex.join(CAPD)} --help | head -1; "
                           'echo "status=${PIPESTATUS[0]}" >&2'],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.startswith("usage: capd")
    assert done.stderr in ("status=0\n", "status=141\n")


# ------------------------------------------------------------------ error sentences


def test_a_failed_reload_is_one_sentence_on_stderr(start: Start, short_tmp: Path) -> None:
    """`capd reload` after capd.toml broke: `capd: reload failed: <reason>`, exit 1."""
    daemon = start()
    config = short_tmp / "capd.toml"
    config.write_text("recheck_coldown_s = 3\n" + config.read_text())
    done = capd("reload", socket=daemon.socket)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"capd: reload failed: {config}: recheck_coldown_s: unknown key "
                           "(did you mean recheck_cooldown_s?)\n")
    as_json = capd("reload", "--json", socket=daemon.socket)
    assert as_json.returncode == 1
    body = json.loads(as_json.stdout)
    assert (body["ok"], "recheck_coldown_s" in body["error"]) == (False, True)


def test_a_failed_call_is_one_sentence_on_stderr(start: Start, web: FlipServer) -> None:
    """A call answered 503 prints `capd: NAME failed: <message> (status, type)`, exit 1."""
    daemon = start()
    web.healthy = False
    assert capd("recheck-tool", "web", "--force", socket=daemon.socket).returncode == 0
    done = capd("call", "e2e.web", socket=daemon.socket)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("capd: e2e.web failed: ")
    assert "is disabled: missing web" in done.stderr
    assert "(error_transient, capability_disabled); alternatives: e2e.echo" in done.stderr
    assert done.stderr.count("\n") == 1


def test_a_failing_health_check_still_prints_its_report(start: Start, web: FlipServer) -> None:
    """`capd health` prints its report on stdout, a warning included, not a sentence."""
    daemon = start()
    web.healthy = False
    capd("recheck-tool", "web", "--force", socket=daemon.socket)
    done = capd("health", socket=daemon.socket)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("warn: ")


def test_the_daemon_warns_about_an_unknown_environment_variable(start: Start) -> None:
    """`capd serve` logs unknown_environment_variable with the suggestion, then serves."""
    daemon = start(env={"CAPD_DRAIN_GRACE": "1"})
    event = daemon.wait_event("unknown_environment_variable")
    assert (event["variable"], event["did_you_mean"]) == ("CAPD_DRAIN_GRACE",
                                                          "CAPD_DRAIN_GRACE_S")
    assert event["level"] == "warning"


# ------------------------------------------------------------------ Ctrl-C at start-up

SLOW_PACK = '''
import time
from pathlib import Path

from pydantic import BaseModel
from capd.registry import op

MARKER = Path(__file__).with_name("probing")


class Text(BaseModel):
    text: str = "x"


@op("slow.echo")
def echo(params: Text) -> str:
    return params.text


def slow_probe() -> bool:
    MARKER.touch()
    time.sleep(60)
    return True
'''


def test_ctrl_c_during_start_up_exits_130_without_a_traceback(short_tmp: Path) -> None:
    """SIGINT while a probe is still running: exit 130 at once, stderr empty, never ready."""
    (short_tmp / "slow_pack.py").write_text(SLOW_PACK)
    (short_tmp / "caps.toml").write_text(
        '[[capability]]\nname = "slow.echo"\nop = "slow.echo"\nsummary = "Echo."\n'
        'requires = ["gate"]\n')
    config = short_tmp / "capd.toml"
    config.write_text('plugins = ["slow_pack"]\nplugin_paths = ["."]\n'
                      'declarations = ["caps.toml"]\nentry_points = false\n'
                      'state_dir = "state"\n\n[tools.gate]\nkind = "python"\n'
                      'target = "slow_pack:slow_probe"\ntimeout_s = 120\n')
    daemon = DaemonProcess(config, short_tmp / "capd.sock").start()
    try:
        deadline = time.monotonic() + 30
        while not (short_tmp / "probing").exists():  # the probe has started: mid start-up
            assert time.monotonic() < deadline, daemon.stderr
            time.sleep(0.05)
        daemon.signal(signal.SIGINT)
        code = daemon.wait_exit(timeout=20)  # well before the probe's 60 s sleep ends
    finally:
        daemon.kill()
    assert code == 130
    assert daemon.stderr == ""
    assert not any(e.get("event") == "ready" for e in daemon.events)
    assert not (short_tmp / "capd.sock").exists()


@pytest.mark.parametrize("args", [
    ("list", "--limit", "abc"), ("search", "x", "-k", "0"), ("export",),
    ("call", "e2e.echo", "--timeout", "nan"), ("call", "e2e.echo", "--timeout", "-1"),
])
def test_a_malformed_value_or_a_missing_option_is_a_usage_error(args: tuple[str, ...]) -> None:
    """The CLI refuses what it can see is wrong, before asking the daemon: exit 2 and the
    usage, whether or not a daemon answers."""
    done = capd(*args, socket=Path("/nonexistent/capd.sock"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"usage: capd {args[0]}")
    assert "is the daemon running" not in done.stderr


@pytest.mark.parametrize(("argv", "hint"), [
    (["lst"], "(did you mean list?)"),
    (["list", "--jsn"], "(did you mean --json"),
    (["queue", "lst"], "(did you mean list"),
])
def test_a_misspelt_command_or_flag_gets_a_did_you_mean_and_exit_2(
        argv: list[str], hint: str) -> None:
    """A misspelt command or flag is a usage error (exit 2) that names the close match."""
    done = subprocess.run([sys.executable, "-m", "capd", *argv], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert hint in done.stderr, done.stderr
