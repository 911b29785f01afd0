"""Nothing raw reaches a terminal: control characters and bidi overrides in text that capd
prints for a person are escaped visibly (``\\x1b``); ``--json`` stays exact.

The escaping function and the renderers are tested directly; then a real daemon serves a
declaration whose texts hold ESC, BEL and U+202E, and the real CLI prints them.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capd.sidecar.client._render import (
    describe_failure,
    render_agent,
    render_call,
    render_jobs,
    render_json,
    render_list,
    render_search,
)
from capd.sidecar.client._terminal import Document, echo, one_line, printable
from tests.helpers.daemon import DaemonProcess

DIRECTION_CONTROLS = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
RAW = (b"\x1b", b"\x07", "\u202e".encode())  # what must never reach the terminal


# ------------------------------------------------------------------------ printable()


@pytest.mark.parametrize("code", [c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)])
def test_c0_controls_are_escaped_as_hex(code: int) -> None:
    """Every C0 control but tab, newline and CR reads as ``\\xHH``."""
    assert printable(f"a{chr(code)}b") == f"a\\x{code:02x}b"


def test_escape_bel_and_csi_in_the_usual_form() -> None:
    """An SGR sequence and BEL read as ``\\x1b[31m`` and ``\\x07``."""
    assert printable("\x1b[31mred\x07") == "\\x1b[31mred\\x07"


def test_carriage_return_is_escaped() -> None:
    """CR cannot rewrite a line already shown: it reads as ``\\r``."""
    assert printable("ok\rFAIL") == "ok\\rFAIL"


def test_newline_and_tab_are_kept_by_printable() -> None:
    """printable() keeps the layout characters ``\\n`` and ``\\t``."""
    assert printable("a\tb\nc") == "a\tb\nc"


def test_one_line_escapes_newline_and_tab_too() -> None:
    """one_line() keeps a value in its table cell: ``\\n`` and ``\\t`` are escaped."""
    assert one_line("a\tb\nc\x1b") == "a\\tb\\nc\\x1b"


def test_del_is_escaped() -> None:
    """DEL (U+007F) reads as ``\\x7f``."""
    assert printable("a\x7fb") == "a\\x7fb"


@pytest.mark.parametrize("code", range(0x80, 0xA0))
def test_c1_controls_are_escaped(code: int) -> None:
    """Every C1 control (U+0080-U+009F; U+009B is a one-byte CSI) reads as ``\\xHH``."""
    assert printable(chr(code)) == f"\\x{code:02x}"


@pytest.mark.parametrize("code", DIRECTION_CONTROLS)
def test_bidi_and_direction_controls_are_escaped(code: int) -> None:
    """Bidi embeddings, overrides, isolates and direction marks read as ``\\uHHHH``."""
    assert printable(f"x{chr(code)}y") == f"x\\u{code:04x}y"


def test_right_to_left_override_is_escaped() -> None:
    """U+202E cannot make a name read backwards: it reads as ``\\u202e``."""
    assert printable("invoice\u202efdp.exe") == "invoice\\u202efdp.exe"


def test_line_separators_and_lone_surrogates_are_escaped() -> None:
    """U+2028, U+2029 and a lone surrogate (unencodable in UTF-8) are escaped."""
    assert printable("a\u2028b\u2029c\ud800") == "a\\u2028b\\u2029c\\ud800"
    printable("\udfff").encode("utf-8")  # nothing left that UTF-8 refuses


@pytest.mark.parametrize("text", ["café é ü ß", "日本語のテキスト", "emoji 🙂 🚀",
                                  "family 👨\u200d👩\u200d👧", "no\u00a0break", "Ωμέγα ≤ ∞",
                                  "a \\x1b backslash stays one"])
def test_ordinary_unicode_is_kept_as_is(text: str) -> None:
    """Letters, CJK, emoji (with their zero-width joiners), NBSP and backslashes stay as is."""
    assert printable(text) == text
    assert one_line(text) == text


@given(st.text())
def test_nothing_that_steers_a_terminal_survives(text: str) -> None:
    """For any text, printable() leaves no control but ``\\n``/``\\t`` and no bidi control."""
    out = printable(text)
    assert all(ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs") for ch in out)
    assert not {ord(ch) for ch in out} & {*DIRECTION_CONTROLS, 0x2028, 0x2029}
    assert all(unicodedata.category(ch) not in ("Cc", "Cs") for ch in one_line(text))


@given(st.text())
def test_escaping_twice_changes_nothing(text: str) -> None:
    """printable() and one_line() are idempotent, so the renderers and echo can both apply."""
    assert printable(printable(text)) == printable(text)
    assert printable(one_line(text)) == one_line(text)


# ----------------------------------------------------------------------------- echo()


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_echo_escapes_text_even_when_redirected(capsys: pytest.CaptureFixture[str]) -> None:
    """Human text is escaped on a pipe too: it may reach a terminal later (``| less -R``)."""
    echo("\x1b[2Jgone\x07")
    echo("err \u202eeht", err=True)
    out, err = capsys.readouterr()
    assert (out, err) == ("\\x1b[2Jgone\\x07\n", "err \\u202eeht\n")


def test_echo_writes_a_document_exactly_when_redirected(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A machine format (metrics, TOML, JSON) on a pipe is written byte for byte."""
    echo(Document('name = "a\u202eb"\n'), end="")
    assert capsys.readouterr().out == 'name = "a\u202eb"\n'


def test_echo_escapes_a_document_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal a person reads the document: it is escaped like other text."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    echo(Document("capd_calls{capability=\"a\x1bb\"} 1"))
    assert terminal.getvalue() == 'capd_calls{capability="a\\x1bb"} 1\n'


def test_echo_lets_a_broken_pipe_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that went away raises BrokenPipeError, for main() to turn into exit 141."""
    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    monkeypatch.setattr(sys, "stdout", Gone())
    with pytest.raises(BrokenPipeError):
        echo("row")


# ------------------------------------------------------------------------- renderers


def test_a_summary_with_a_newline_cannot_draw_a_row() -> None:
    """A newline in a summary stays in its cell: the table keeps one row per capability."""
    body = {"capabilities": [{"state": "live", "name": "a.b",
                              "summary": "fine\nlive      evil.cap forged"}]}
    lines = render_list(body).splitlines()
    assert len(lines) == 2
    assert lines[1].endswith("fine\\nlive      evil.cap forged")


def test_a_list_with_more_pages_says_how_to_see_the_next() -> None:
    """A page that is not the last ends with the command for the next one (its cursor
    escaped like any value the daemon sent)."""
    body = {"capabilities": [{"state": "live", "name": "a.b", "summary": "s"}],
            "next_cursor": "100"}
    assert render_list(body).splitlines()[-1] == (
        "... more: capd list --cursor 100 (or --limit up to 1000)")
    assert "more" not in render_list({**body, "next_cursor": None})


def test_search_rows_escape_summary_missing_tools_and_hints() -> None:
    """A search row escapes the summary, the missing tools and the install hints."""
    hit = {"name": "a.b", "state": "disabled", "score": 0.5, "summary": "s\x1b[0m",
           "disabled": {"missing": ["t\x07"], "install_hints": {"t\x07": "run\n\u202ex"}}}
    text = render_search({"results": [hit]})
    assert "s\\x1b[0m (missing: t\\x07) (install t\\x07: run\\n\\u202ex)" in text
    assert len(text.splitlines()) == 2


def test_a_job_row_escapes_its_last_error() -> None:
    """A retry job's last error (an upstream's message) stays on the job's row, escaped."""
    job = {"id": "j1", "state": "dead", "attempts": 3, "max_attempts": 3,
           "capability": "a.b", "last_error": "boom\n\x1b]0;title\x07"}
    lines = render_jobs({"jobs": [job]}).splitlines()
    assert len(lines) == 2
    assert lines[1].endswith("boom\\n\\x1b]0;title\\x07")


def test_a_failed_call_cannot_forge_its_queued_line() -> None:
    """A message holding a newline cannot print a fake ``queued as job`` line."""
    body = {"status": "error_permanent", "error_type": "E", "message": "x\nqueued as job FAKE",
            "queued": None}
    assert render_call(body).splitlines() == ["error_permanent: E: x\\nqueued as job FAKE"]


def test_an_agent_description_is_escaped() -> None:
    """An agent's description and entries are escaped on their lines."""
    body = {"agent": "r", "description": "d\u202e\x1b[5m",
            "expansion": [{"entry": "e\x07", "kind": "name", "capabilities": []}]}
    assert render_agent(body).splitlines() == ["r: d\\u202e\\x1b[5m",
                                               "  e\\x07 (name) -> NOTHING: "]


def test_a_failure_sentence_keeps_its_lines_for_echo_to_escape() -> None:
    """describe_failure keeps a message's own lines; echo escapes what could steer."""
    body = {"capability": "a.b", "status": "error_permanent", "error_type": "E",
            "message": "first\nsecond\x1b[31m"}
    assert describe_failure("call", body) == (
        "a.b failed: first\nsecond\x1b[31m (error_permanent, E)")
    assert printable(describe_failure("call", body)).count("\x1b") == 0


def test_a_json_rendering_is_a_document_of_ascii() -> None:
    """The pretty-JSON rendering is a Document; json.dumps has escaped every control in it."""
    text = render_json({"s": "\x1b\x07\u202e é"})
    assert isinstance(text, Document)
    assert text == '{\n  "s": "\\u001b\\u0007\\u202e \\u00e9"\n}'


# ------------------------------------------------------- the real daemon, the real CLI

SUMMARY = "Paint \x1b[31mred\x07 and \u202eflip"
DESCRIPTION = "Sets the title \x1b]0;pwned\x07 and \u2066isolates\u2069."
TAG = "odd\x1b[0m"
FAIL_MESSAGE = "upstream said \x1b[31mred\x07 \u202eevil"
BUSY_MESSAGE = "busy \x1b[5mblink\x07"
AGENT_DESCRIPTION = "Agent \x1b[1mbold\x07 \u202eback"

PACK = '''
from pydantic import BaseModel, Field
from capd.registry import PermanentToolError, TransientToolError, op


class Text(BaseModel):
    text: str = Field("x", description="Any text.")


@op("term.echo")
async def echo(params: Text) -> dict:
    return {"text": params.text}


@op("term.fail")
async def fail(params: Text) -> None:
    raise PermanentToolError("upstream said \\x1b[31mred\\x07 \\u202eevil")


@op("term.busy")
async def busy(params: Text) -> None:
    raise TransientToolError("busy \\x1b[5mblink\\x07")
'''

# TOML basic strings carry the controls as \\uXXXX escapes.
DECLARATIONS = r'''
[[capability]]
name = "term.paint"
op = "term.echo"
summary = "Paint \u001b[31mred\u0007 and \u202eflip"
description = "Sets the title \u001b]0;pwned\u0007 and \u2066isolates\u2069."
tags = ["term", "odd\u001b[0m"]

[[capability]]
name = "term.fail"
op = "term.fail"
summary = "Always refused by its upstream."

[[capability]]
name = "term.busy"
op = "term.busy"
summary = "A write whose upstream is always busy."
mutates_state = true
retry_policy = "replay"
'''

CONFIG = r'''
plugins = ["term_pack"]
plugin_paths = ["."]
declarations = ["caps.toml"]
entry_points = false
state_dir = "state"

[agents.painter]
description = "Agent \u001b[1mbold\u0007 \u202eback"
capabilities = ["term.paint"]
'''


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """A short folder holding the pack, the declarations and capd.toml."""
    path = Path(tempfile.mkdtemp(prefix="capd-", dir="/tmp"))
    (path / "term_pack.py").write_text(textwrap.dedent(PACK))
    (path / "caps.toml").write_text(DECLARATIONS)
    (path / "capd.toml").write_text(CONFIG)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon(folder: Path) -> Iterator[DaemonProcess]:
    """The real daemon serving the declarations (read-only tests share it)."""
    process = DaemonProcess(folder / "capd.toml", folder / "capd.sock").start().wait_ready()
    yield process
    process.kill()


def capd(daemon: DaemonProcess | None, *args: str) -> subprocess.CompletedProcess[bytes]:
    tail = ["--socket", str(daemon.socket)] if daemon else []
    return subprocess.run([sys.executable, "-m", "capd", *args, *tail], capture_output=True,
                          timeout=60, check=False)


def assert_nothing_raw(done: subprocess.CompletedProcess[bytes]) -> None:
    for stream in (done.stdout, done.stderr):
        for raw in RAW:
            assert raw not in stream, (raw, stream)


@pytest.mark.slow
def test_the_declaration_holds_the_raw_characters(daemon: DaemonProcess) -> None:
    """The daemon itself serves the texts exactly as declared (the premise of the rest)."""
    body = daemon.call("GET", "/capabilities/term.paint").body
    assert (body["summary"], body["description"], body["tags"]) == (SUMMARY, DESCRIPTION,
                                                                   ["term", TAG])


@pytest.mark.slow
def test_list_escapes_a_summary(daemon: DaemonProcess) -> None:
    """`capd list` shows the summary with ``\\x1b``, ``\\x07`` and ``\\u202e``, nothing raw."""
    done = capd(daemon, "list")
    assert done.returncode == 0, done.stderr
    assert_nothing_raw(done)
    assert "Paint \\x1b[31mred\\x07 and \\u202eflip" in done.stdout.decode()


@pytest.mark.slow
def test_list_json_is_exact(daemon: DaemonProcess) -> None:
    """`capd list --json` is the HTTP body: it parses back to the very same summary."""
    done = capd(daemon, "list", "--json")
    assert done.returncode == 0, done.stderr
    assert_nothing_raw(done)  # json.dumps escapes them as \u001b
    body = json.loads(done.stdout)
    assert done.stdout.decode() == json.dumps(daemon.call("GET", "/capabilities").body,
                                              indent=2) + "\n"
    [paint] = [c for c in body["capabilities"] if c["name"] == "term.paint"]
    assert paint["summary"] == SUMMARY


@pytest.mark.slow
def test_search_escapes_a_summary(daemon: DaemonProcess) -> None:
    """`capd search paint red` finds the capability and shows its summary escaped."""
    done = capd(daemon, "search", "paint", "red")
    assert done.returncode == 0, done.stderr
    assert_nothing_raw(done)
    assert "term.paint" in done.stdout.decode()
    assert "\\x1b[31mred\\x07 and \\u202eflip" in done.stdout.decode()
    exact = json.loads(capd(daemon, "search", "paint", "red", "--json").stdout)
    assert exact["results"][0]["summary"] == SUMMARY


@pytest.mark.slow
def test_show_prints_escapes_and_json_keeps_the_exact_texts(daemon: DaemonProcess) -> None:
    """`capd show` (fields) shows the controls escaped; `--json` parses back to the declared
    texts."""
    done = capd(daemon, "show", "term.paint")
    assert done.returncode == 0, done.stderr
    assert_nothing_raw(done)
    assert "Sets the title \\x1b]0;pwned\\x07" in done.stdout.decode()
    exact = json.loads(capd(daemon, "show", "term.paint", "--json").stdout)
    assert (exact["summary"], exact["description"], exact["tags"]) == (SUMMARY, DESCRIPTION,
                                                                      ["term", TAG])


@pytest.mark.slow
def test_a_failing_call_escapes_the_upstream_message(daemon: DaemonProcess) -> None:
    """A refused call exits 1 and shows the upstream's message escaped, nothing raw."""
    done = capd(daemon, "call", "term.fail")
    assert done.returncode == 1
    assert_nothing_raw(done)
    shown = (done.stdout + done.stderr).decode()
    assert "upstream said \\x1b[31mred\\x07 \\u202eevil" in shown


@pytest.mark.slow
def test_a_failing_call_json_keeps_the_exact_message(daemon: DaemonProcess) -> None:
    """`capd call --json` of a refused call holds the upstream's message byte for byte."""
    done = capd(daemon, "call", "term.fail", "--json")
    assert done.returncode == 1
    assert_nothing_raw(done)
    assert json.loads(done.stdout)["message"] == FAIL_MESSAGE


@pytest.mark.slow
def test_a_failed_reload_escapes_the_error(folder: Path, short_tmp: Path) -> None:
    """A reload refused over a value holding ESC exits 1, the error escaped; --json exact."""
    for name in ("term_pack.py", "caps.toml", "capd.toml"):
        shutil.copy(folder / name, short_tmp / name)
    process = DaemonProcess(short_tmp / "capd.toml", short_tmp / "capd.sock").start()
    try:
        process.wait_ready()
        with (short_tmp / "capd.toml").open("a") as config:
            config.write('\n[tools.x]\nkind = "http\\u001b[2J"\n')
        done = capd(process, "reload")
        assert done.returncode == 1
        assert_nothing_raw(done)
        assert "'http\\x1b[2J'" in done.stderr.decode()
        exact = capd(process, "reload", "--json")
        assert "'http\x1b[2J'" in json.loads(exact.stdout)["error"]
    finally:
        process.kill()


@pytest.mark.slow
def test_a_queued_write_and_the_queue_list_escape_the_error(daemon: DaemonProcess) -> None:
    """A transient failure is queued; the call and `capd queue list` show its error escaped."""
    done = capd(daemon, "call", "term.busy")
    assert_nothing_raw(done)
    assert "busy \\x1b[5mblink\\x07" in (done.stdout + done.stderr).decode()
    jobs = json.loads(capd(daemon, "queue", "list", "--json").stdout)["jobs"]
    [job] = [j for j in jobs if j["capability"] == "term.busy"]
    assert job["last_error"] == BUSY_MESSAGE
    table = capd(daemon, "queue", "list")
    assert table.returncode == 0, table.stderr
    assert_nothing_raw(table)
    assert "busy \\x1b[5mblink\\x07" in table.stdout.decode()


@pytest.mark.slow
def test_agent_show_and_list_escape_the_description(daemon: DaemonProcess) -> None:
    """`capd agent show` escapes an agent's description; `--json` keeps it exact."""
    done = capd(daemon, "agent", "show", "painter")
    assert done.returncode == 0, done.stderr
    assert_nothing_raw(done)
    assert "Agent \\x1b[1mbold\\x07 \\u202eback" in done.stdout.decode()
    assert json.loads(capd(daemon, "agent", "show", "painter", "--json").stdout)[
        "description"] == AGENT_DESCRIPTION
    assert_nothing_raw(capd(daemon, "agent", "list"))


@pytest.mark.slow
def test_health_prints_nothing_raw(daemon: DaemonProcess) -> None:
    """`capd health` (its status line and failing checks) prints nothing raw."""
    done = capd(daemon, "health")
    assert_nothing_raw(done)


@pytest.mark.slow
def test_check_escapes_a_declaration_error_and_keeps_json_exact(tmp_path: Path) -> None:
    """`capd check --strict` names a bad declaration escaped, exit 1; `--json` keeps it exact."""
    (tmp_path / "caps.toml").write_text(textwrap.dedent(r'''
        [[capability]]
        name = "bad.\u001b[31mname"
        op = "no.such\u0007op"
        summary = "S \u202e"
    '''))
    config = tmp_path / "capd.toml"
    config.write_text('declarations = ["caps.toml"]\nentry_points = false\nstate_dir = "s"\n')
    done = capd(None, "check", "--strict", "--config", str(config))
    assert done.returncode == 1
    assert_nothing_raw(done)
    assert "bad.\\x1b[31mname" in done.stdout.decode()
    report = json.loads(capd(None, "check", "--config", str(config), "--json").stdout)
    assert report["errors"][0]["capability"] == "bad.\x1b[31mname"


@pytest.mark.slow
def test_a_text_format_on_a_pipe_is_the_http_body(daemon: DaemonProcess) -> None:
    """`capd agent resolve --format codex` (TOML) is written byte for byte when redirected."""
    done = capd(daemon, "agent", "resolve", "painter", "--format", "codex")
    assert done.returncode == 0, done.stderr
    reply = daemon.call("GET", "/agents/painter/resolve?format=codex")
    assert isinstance(reply.body, str)
    assert done.stdout.decode() == reply.body


@pytest.mark.parametrize("code", [0x200B, 0x2060, 0x2061, 0x2064, 0xFEFF])
def test_invisible_characters_that_hide_text_are_shown(code: int) -> None:
    """A zero-width space, word joiner or BOM inside a name would hide what it splits."""
    from capd.sidecar.client._terminal import printable

    assert printable(f"notes{chr(code)}.append") == f"notes\\u{code:04x}.append"
