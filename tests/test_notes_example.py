"""The bundled notes pack: no symlink out of the vault, no line break in a title.

The ops are called directly on real files, and once through the real daemon
over its Unix socket, since the example is what people copy.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import ValidationError

from capd.registry import PermanentToolError, parameters_schema
from tests.helpers.daemon import DaemonProcess
from tests.helpers.servers import EXAMPLES

# Every character str.splitlines() breaks a line on.
LINE_BREAKS = ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
SECRET = b"outside the vault\n"


@pytest.fixture(scope="module")
def pack() -> ModuleType:
    """The example's notes_pack, imported under a private name (nothing global is touched)."""
    spec = importlib.util.spec_from_file_location(
        "capd_test_notes_pack", EXAMPLES / "notes_pack" / "__init__.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    """A vault with one real note."""
    folder = tmp_path / "vault"
    folder.mkdir()
    (folder / "real.md").write_bytes(b"# Real\n\nkubernetes lives here\n")
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the vault that a symlink may point at."""
    target = tmp_path / "elsewhere" / "secret.md"
    target.parent.mkdir()
    target.write_bytes(SECRET)
    return target


def append(pack: ModuleType, vault: Path, note: str, line: str) -> Any:
    return pack.append_line(pack.AppendParams(note=note, line=line), vault=str(vault))


def create(pack: ModuleType, vault: Path, note: str, title: str | None = None) -> Any:
    return pack.create_note(pack.CreateParams(note=note, title=title), vault=str(vault))


def search(pack: ModuleType, vault: Path, query: str) -> list[dict[str, Any]]:
    found = pack.search_notes(pack.SearchParams(query=query), vault=str(vault))
    matches: list[dict[str, Any]] = found["matches"]
    return matches


# ------------------------------------------------------------------ append


def test_append_writes_the_line_byte_for_byte(pack: ModuleType, vault: Path) -> None:
    """append adds the line and one \\n, keeping a \\r inside the line as it is."""
    append(pack, vault, "real", "a\rb")
    assert (vault / "real.md").read_bytes().endswith(b"kubernetes lives here\na\rb\n")


@pytest.mark.parametrize("char", [c for c in LINE_BREAKS if c != "\n"])
def test_append_line_accepts_every_break_but_newline(pack: ModuleType, char: str) -> None:
    """The line model refuses only \\n; \\r and the other breaks stay callable."""
    assert pack.AppendParams(note="n", line=f"a{char}b").line == f"a{char}b"


def test_append_line_refuses_a_newline(pack: ModuleType) -> None:
    """A \\n in the line (even a trailing one) is a validation error on `line`."""
    for line in ("a\nb", "a\n"):
        with pytest.raises(ValidationError) as caught:
            pack.AppendParams(note="n", line=line)
        assert caught.value.errors()[0]["loc"] == ("line",)


def test_append_refuses_a_symlinked_note_and_leaves_the_target_unchanged(
    pack: ModuleType, vault: Path, outside: Path
) -> None:
    """A note that is a symlink out of the vault is refused; the file it points at is untouched."""
    (vault / "evil.md").symlink_to(outside)
    with pytest.raises(PermanentToolError, match=r"note 'evil' is a symlink; capd refuses "
                       r"to follow it out of the vault"):
        append(pack, vault, "evil", "pwned")
    assert outside.read_bytes() == SECRET


def test_append_refuses_a_dangling_symlink_without_creating_its_target(
    pack: ModuleType, vault: Path, tmp_path: Path
) -> None:
    """A symlink to a file that does not exist yet is refused, and nothing is created there."""
    target = tmp_path / "would-be.md"
    (vault / "evil.md").symlink_to(target)
    with pytest.raises(PermanentToolError, match="is a symlink"):
        append(pack, vault, "evil", "pwned")
    assert not target.exists()


def test_append_to_a_missing_note_says_create_it_first(pack: ModuleType, vault: Path) -> None:
    """A note that does not exist is not created by append; the error says what to do."""
    with pytest.raises(FileNotFoundError, match="'ghost' does not exist; create it first"):
        append(pack, vault, "ghost", "x")
    assert not (vault / "ghost.md").exists()


def test_append_to_a_fifo_is_refused_without_hanging(pack: ModuleType, vault: Path) -> None:
    """A FIFO named like a note is not a note: refused at once, never blocked on."""
    os.mkfifo(vault / "pipe.md")
    with pytest.raises(PermanentToolError, match="'pipe' is not a regular file"):
        append(pack, vault, "pipe", "x")


def test_the_vault_itself_may_be_a_symlink(pack: ModuleType, vault: Path, tmp_path: Path
                                           ) -> None:
    """Only entries inside the vault are refused; a symlinked vault folder is the operator's."""
    linked = tmp_path / "linked-vault"
    linked.symlink_to(vault, target_is_directory=True)
    append(pack, linked, "real", "via the link")
    create(pack, linked, "fresh", "Fresh")
    assert (vault / "real.md").read_bytes().endswith(b"via the link\n")
    assert (vault / "fresh.md").read_bytes() == b"# Fresh\n\n"
    assert [m["note"] for m in search(pack, linked, "via the link")] == ["real"]


# ------------------------------------------------------------------ create


def test_create_writes_the_title_heading(pack: ModuleType, vault: Path) -> None:
    """create makes a new note whose first line is the title as a heading."""
    create(pack, vault, "trip", "Trip to Lisbon")
    assert (vault / "trip.md").read_bytes() == b"# Trip to Lisbon\n\n"


def test_create_over_a_symlink_is_refused(pack: ModuleType, vault: Path, outside: Path,
                                          tmp_path: Path) -> None:
    """A symlink where the new note would go is refused, dangling or not; no target is touched."""
    (vault / "evil.md").symlink_to(outside)
    dangling = tmp_path / "would-be.md"
    (vault / "ghost.md").symlink_to(dangling)
    for note in ("evil", "ghost"):
        with pytest.raises(PermanentToolError, match=f"note '{note}' is a symlink"):
            create(pack, vault, note, "Hijack")
    assert outside.read_bytes() == SECRET
    assert not dangling.exists()


def test_create_over_an_existing_note_is_refused(pack: ModuleType, vault: Path) -> None:
    """create never overwrites: an existing note raises FileExistsError and keeps its text."""
    with pytest.raises(FileExistsError):
        create(pack, vault, "real", "Again")
    assert (vault / "real.md").read_bytes() == b"# Real\n\nkubernetes lives here\n"


@pytest.mark.parametrize("char", LINE_BREAKS)
def test_title_with_a_line_break_is_refused(pack: ModuleType, char: str) -> None:
    """Every line-break character in a title is a validation error on `title`."""
    with pytest.raises(ValidationError) as caught:
        pack.CreateParams(note="n", title=f"Title{char}# injected")
    assert caught.value.errors()[0]["loc"] == ("title",)


def test_title_rule_is_in_the_schema_agents_see(pack: ModuleType) -> None:
    """The one-line rule is a JSON Schema pattern, so an agent sees it before calling."""
    schema = parameters_schema(pack.CreateParams)
    assert schema["properties"]["title"]["pattern"] == pack.ONE_LINE
    assert pack.CreateParams(note="n", title="Plain — with ünïcode").title


# ------------------------------------------------------------------ search and publish


def test_search_skips_symlinked_notes(pack: ModuleType, vault: Path, outside: Path) -> None:
    """Search reads real notes only: a symlink out of the vault is never read."""
    (vault / "evil.md").symlink_to(outside)
    (vault / "inside.md").symlink_to(vault / "real.md")
    assert search(pack, vault, "outside the vault") == []
    assert [m["note"] for m in search(pack, vault, "kubernetes")] == ["real"]


def test_search_skips_a_fifo_without_hanging(pack: ModuleType, vault: Path) -> None:
    """A FIFO named like a note is skipped at once, not opened for a blocking read."""
    os.mkfifo(vault / "pipe.md")
    assert [m["note"] for m in search(pack, vault, "kubernetes")] == ["real"]


async def test_publish_refuses_a_symlinked_note(pack: ModuleType, vault: Path, outside: Path
                                                ) -> None:
    """publish never sends a file that a symlink in the vault points at."""
    (vault / "evil.md").symlink_to(outside)
    with pytest.raises(PermanentToolError, match="note 'evil' is a symlink"):
        await pack.publish_note(pack.PublishParams(note="evil"), vault=str(vault),
                                server=str(vault / "sync-server.sock"))


# ------------------------------------------------------------------ through the daemon


@pytest.fixture
def example_daemon(example_copy: Path, short_tmp: Path) -> Iterator[DaemonProcess]:
    """The real daemon serving a private copy of the bundled example."""
    daemon = DaemonProcess(example_copy / "capd.toml", short_tmp / "capd.sock",
                           env={"CAPD_STATE_DIR": str(short_tmp / "state")})
    try:
        yield daemon.start().wait_ready()
    finally:
        daemon.kill()


@pytest.fixture
def served_vault(example_daemon: DaemonProcess, short_tmp: Path) -> Path:
    """The vault the example daemon writes: its copy in the state dir, seeded at start."""
    return short_tmp / "state" / "example-vault"


@pytest.mark.slow
def test_daemon_refuses_append_through_a_symlinked_note(
    example_daemon: DaemonProcess, served_vault: Path, outside: Path
) -> None:
    """POST /call/notes.append on a symlinked note answers error_permanent; the target is intact."""
    (served_vault / "evil.md").symlink_to(outside)
    answer = example_daemon.call("POST", "/call/notes.append",
                                 {"note": "evil", "line": "pwned"})
    assert answer.status == 502, answer.body
    assert answer.body["status"] == "error_permanent"
    assert answer.body["queued"] is None
    assert "is a symlink; capd refuses to follow it out of the vault" in answer.body["message"]
    assert outside.read_bytes() == SECRET
    fine = example_daemon.call("POST", "/call/notes.append",
                               {"note": "welcome", "line": "still works"})
    assert fine.body["status"] == "success", fine.body


@pytest.mark.slow
def test_daemon_answers_422_to_a_title_with_a_line_break(
    example_daemon: DaemonProcess, served_vault: Path
) -> None:
    """POST /call/notes.create with a line separator in the title is 422; no note is made."""
    answer = example_daemon.call("POST", "/call/notes.create",
                                 {"note": "inject", "title": "Hi\u2028# injected"})
    assert answer.status == 422, answer.body
    assert "title" in answer.body["detail"]
    assert not (served_vault / "inject.md").exists()
