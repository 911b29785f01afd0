"""The unit files verify cleanly with systemd-analyze; the launchd plist parses."""

from __future__ import annotations

import configparser
import plistlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.servers import ROOT

UNITS = ROOT / "systemd"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is missing: .ci/run installs Debian's systemd")


def fake_root(tmp: Path, *, user: bool) -> Path:
    """A root holding systemd's own units, ours, and a stub capd binary where ExecStart says."""
    root = tmp / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    if Path("/usr/lib/systemd/user").is_dir():
        shutil.copytree("/usr/lib/systemd/user", root / "usr/lib/systemd/user", symlinks=True)
    target = root / ("etc/systemd/user" if user else "etc/systemd/system")
    target.mkdir(parents=True)
    source = UNITS / "user" if user else UNITS
    for unit in (source / "capd.service", source / "capd.socket"):
        shutil.copy(unit, target / unit.name)
    stub = root / "usr/local/bin/capd"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    return root


@needs_analyze
def test_system_units_verify_without_warnings(tmp_path: Path) -> None:
    """systemd-analyze verify: exit 0 and nothing printed, for the service and the socket."""
    root = fake_root(tmp_path, user=False)
    done = subprocess.run([str(ANALYZE), "verify", f"--root={root}", "capd.service",
                           "capd.socket"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@needs_analyze
def test_user_units_verify_without_warnings(tmp_path: Path) -> None:
    """The --user variant verifies too (with a home whose ~/.local/bin holds a stub capd)."""
    home = tmp_path / "home"
    stub = home / ".local/bin/capd"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    units = tmp_path / "units"
    shutil.copytree(UNITS / "user", units)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    done = subprocess.run([str(ANALYZE), "verify", "--user", "capd.service", "capd.socket"],
                          capture_output=True, text=True, timeout=120, check=False, cwd=units,
                          env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@needs_analyze
def test_security_exposure_is_ok() -> None:
    """The sandbox scores below 3.0 ("OK") in systemd-analyze security --offline."""
    done = subprocess.run([str(ANALYZE), "security", "--offline=true",
                           str(UNITS / "capd.service")], capture_output=True, text=True,
                          timeout=120, check=False)
    line = next(x for x in done.stdout.splitlines() if "Overall exposure level" in x)
    score = float(line.split(":")[1].split()[0])
    assert score < 3.0, line


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read_string(path.read_text())
    return parser


def test_unit_contracts() -> None:
    """The promises the README makes about the units, checked in the files."""
    service = read_unit(UNITS / "capd.service")["Service"]
    assert service["Type"] == "notify"
    assert service["ExecReload"].endswith("capd reload --socket /run/capd/capd.sock")
    assert "RuntimeDirectory" not in service
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert service[key] == "yes"
    assert service["ProtectSystem"] == "strict"
    socket = read_unit(UNITS / "capd.socket")["Socket"]
    assert (socket["ListenStream"], socket["SocketMode"], socket["SocketGroup"],
            socket["FileDescriptorName"]) == ("/run/capd/capd.sock", "0660", "capd", "api")
    reload_variant = read_unit(UNITS / "capd-notify-reload.service")["Service"]
    assert reload_variant["Type"] == "notify-reload"
    assert "ExecReload" not in reload_variant
    user_socket = read_unit(UNITS / "user/capd.socket")["Socket"]
    assert (user_socket["ListenStream"], user_socket["SocketMode"]) == (
        "%t/capd/capd.sock", "0600")
    users = [line for line in (UNITS / "capd.sysusers.conf").read_text().splitlines()
             if line.startswith("u ")]
    assert [u.split()[1] for u in users] == ["capd", "capd-agent"]
    for unit in ("capd.service", "capd-notify-reload.service", "user/capd.service"):
        # room for max_connections (4096 by default) client descriptors
        assert int(read_unit(UNITS / unit)["Service"]["LimitNOFILE"]) >= 8192, unit


def test_launchd_plist_is_valid() -> None:
    """The LaunchAgent parses as a plist; KeepAlive restarts only after a failed exit."""
    with (UNITS / "dev.capd.capd.plist").open("rb") as handle:
        plist = plistlib.load(handle)
    assert plist["Label"] == "dev.capd.capd"
    assert plist["ProgramArguments"][1] == "serve"
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert isinstance(plist["ExitTimeOut"], int)
    assert plist["Umask"] == 0o077
    assert plist["SoftResourceLimits"]["NumberOfFiles"] >= 8192
    assert "/Library/Logs/" in plist["StandardOutPath"]
