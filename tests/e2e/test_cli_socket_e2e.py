"""The CLI finds its user's daemon wherever a documented socket is, says what to do on a
socket it may not use, and hints at -p for a parameter written as key=value."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from capd.sidecar import DaemonUnreachable
from capd.sidecar._paths import find_socket, socket_candidates
from capd.sidecar.client._client import request
from tests.helpers.daemon import DaemonProcess, FlipServer, write_e2e_config

pytestmark = pytest.mark.slow  # the real daemon, a real socket, a real second uid

FAKE_UID = 4321


@pytest.fixture
def fake_user(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process seen as uid 4321 by the path rules; its /tmp/capd-4321 made and removed."""
    monkeypatch.setattr(os, "getuid", lambda: FAKE_UID)
    monkeypatch.setattr(os, "geteuid", lambda: FAKE_UID)
    folder = Path(f"/tmp/capd-{FAKE_UID}")
    folder.mkdir(mode=0o750)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_cli_with_xdg_runtime_dir_finds_a_daemon_started_without_it(
        tmp_path: Path, fake_user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon started without XDG_RUNTIME_DIR listens in /tmp/capd-<uid>; a CLI whose
    login shell sets XDG_RUNTIME_DIR looks there too (after its own runtime folder)."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    daemons = find_socket()
    assert daemons == fake_user / "capd.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(daemons))
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
        assert socket_candidates()[0] == tmp_path / "capd" / "capd.sock"
        assert find_socket() == daemons
        (tmp_path / "capd").mkdir()
        with socket.socket(socket.AF_UNIX) as own:  # its own runtime folder's comes first
            own.bind(str(tmp_path / "capd" / "capd.sock"))
            assert find_socket() == tmp_path / "capd" / "capd.sock"


def test_a_socket_in_a_folder_others_can_write_is_not_taken(
        tmp_path: Path, fake_user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket whose folder anyone may write (someone could have planted it) is passed
    over: the CLI keeps to its own runtime folder's socket rather than talk to it."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    fake_user.chmod(0o777)
    with socket.socket(socket.AF_UNIX) as planted:
        planted.bind(str(fake_user / "capd.sock"))
        assert find_socket() == tmp_path / "capd" / "capd.sock"
        fake_user.chmod(0o750)  # its own folder: found
        assert find_socket() == fake_user / "capd.sock"


def test_permission_denied_on_the_socket_names_the_way_in(
        short_tmp: Path, web: FlipServer, peer_uid: int) -> None:
    """A uid that may not reach the socket file gets a sentence naming allow_uids,
    allow_gids and the capd group, not a bare 'Permission denied'."""
    config = write_e2e_config(short_tmp, web.port)
    daemon = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
    try:
        os.seteuid(peer_uid)
        try:
            with pytest.raises(DaemonUnreachable) as refused:
                request(daemon.socket, "GET", "/health", timeout_s=10)
        finally:
            os.seteuid(0)
        text = str(refused.value)
        assert "permission denied" in text
        assert "allow_uids" in text
        assert "capd group" in text
    finally:
        daemon.kill()


def test_key_value_after_the_name_hints_at_p() -> None:
    """`capd call X key=value` is a usage error (exit 2) that shows the -p spelling."""
    done = subprocess.run([sys.executable, "-m", "capd", "call", "notes.append", "text=hi",
                           "n:=3", "--socket", "/nonexistent.sock"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "(a parameter is given with -p: -p text=hi -p n:=3)" in done.stderr
