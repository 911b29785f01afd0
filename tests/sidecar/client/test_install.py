"""What an operator installs from: the quick start leaves the checkout clean, the wheel
carries the example and the units, and `capd install-units` prints or writes them."""

from __future__ import annotations

import fnmatch
import os
import plistlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProcess
from tests.helpers.servers import EXAMPLES, ROOT

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes

CAPD = [sys.executable, "-m", "capd"]
PROGRAM = Path(sys.executable).parent / "capd"  # the capd this interpreter's venv runs


def installed(text: str) -> str:
    """A packaged unit as install-units writes it: naming the capd that wrote it."""
    for packaged in ("/usr/local/bin/capd", "%h/.local/bin/capd"):
        text = text.replace(packaged, str(PROGRAM))
    return text
UNITS = ROOT / "systemd"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CAPD, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, check=False)


# ------------------------------------------------------------------ the quick start


def _examples_status() -> str:
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored",
                           "--", "examples"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs git and a checkout")
def test_the_quick_start_never_writes_to_tracked_files(short_tmp: Path) -> None:
    """`capd serve --config examples/capd.toml` + a note appended: examples/ is as it was."""
    status, tree = _examples_status(), _tree(EXAMPLES)
    state = short_tmp / "state"
    daemon = DaemonProcess(EXAMPLES / "capd.toml", short_tmp / "capd.sock",
                           env={"CAPD_STATE_DIR": str(state)}).start()
    try:
        seeded = daemon.wait_event("seeded")
        daemon.wait_ready()
        done = subprocess.run([*CAPD, "call", "notes.append", "-p", "note=welcome",
                               "-p", "line=hello from the quick start", "--socket",
                               str(daemon.socket)], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr
    finally:
        daemon.stop()
    vault = state / "example-vault"
    assert seeded["path"] == str(vault)
    assert (vault / "welcome.md").read_text().endswith("hello from the quick start\n")
    assert (_examples_status(), _tree(EXAMPLES)) == (status, tree)


# ------------------------------------------------------------------ the wheel's data


def test_the_package_data_ships_every_example_and_unit_file() -> None:
    """Each tracked file of examples/ and systemd/ is in a capd.* package or its package-data."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, data = set(project["packages"]), project["package-data"]
    missing = []
    for top in ("examples", "systemd"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            package = ".".join(("capd", *path.relative_to(ROOT).parent.parts))
            shipped = package in packages and (
                path.suffix == ".py"
                or any(fnmatch.fnmatch(path.name, g) for g in data.get(package, ())))
            if not shipped:
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []
    for link in ("examples", "systemd"):  # what the package-dir mapping of "capd" finds
        assert (ROOT / "capd" / link).resolve() == ROOT / link


# ------------------------------------------------------------------ capd install-units


def without_warning(stderr: str) -> str:
    """stderr without the warning a capd the service could not run gets when printed or
    packaged (this test's interpreter may live under /root or /tmp)."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not line.startswith("capd: warning: the service cannot run "))


def test_install_units_print_shows_the_system_units_and_where_they_go() -> None:
    """--print: each packaged file after a `# <target>` line; the text is the file's."""
    done = run("install-units", "--print")
    assert (done.returncode, without_warning(done.stderr)) == (0, "")
    expected = "\n".join([
        f"# /etc/systemd/system/capd.service\n{installed((UNITS / 'capd.service').read_text())}",
        f"# /etc/systemd/system/capd.socket\n{(UNITS / 'capd.socket').read_text()}",
        f"# /etc/sysusers.d/capd.conf\n{(UNITS / 'capd.sysusers.conf').read_text()}",
    ])
    assert done.stdout == expected


def test_install_units_user_writes_into_the_user_unit_folder(tmp_path: Path) -> None:
    """--user writes the per-user units under $XDG_CONFIG_HOME/systemd/user, 0644."""
    done = run("install-units", "--user", env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "systemd" / "user"
    for name in ("capd.service", "capd.socket"):
        assert (folder / name).read_text() == installed((UNITS / "user" / name).read_text())
        assert (folder / name).stat().st_mode & 0o777 == 0o644
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"wrote {folder / 'capd.service'}", f"wrote {folder / 'capd.socket'}",
        "next: systemctl --user daemon-reload && "
        "systemctl --user enable --now capd.socket capd.service"]


def test_install_units_dest_writes_every_file_there_and_replaces_old_ones(tmp_path: Path
                                                                          ) -> None:
    """--dest DIR gets the system set by installed name; an older unit there is replaced."""
    dest = tmp_path / "pkg"
    dest.mkdir()
    (dest / "capd.service").write_text("old\n")
    done = run("install-units", "--dest", str(dest))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["capd.conf", "capd.service",
                                                      "capd.socket"]
    assert (dest / "capd.service").read_text() == installed((UNITS / "capd.service").read_text())
    assert f"ExecStart={PROGRAM} serve" in (dest / "capd.service").read_text()
    assert (dest / "capd.conf").read_bytes() == (UNITS / "capd.sysusers.conf").read_bytes()
    assert "next:" not in done.stderr


def test_install_units_launchd_fills_in_the_home_folder(tmp_path: Path) -> None:
    """--launchd writes the LaunchAgent with /Users/USERNAME replaced by $HOME; it parses."""
    done = run("install-units", "--launchd", "--dest", str(tmp_path),
               env={"HOME": "/Users/alice"})
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "dev.capd.capd.plist").read_text()
    assert "/Users/USERNAME" not in text
    agent = plistlib.loads(text.encode())
    assert agent["ProgramArguments"][0] == str(PROGRAM)  # the capd that wrote it
    assert agent["EnvironmentVariables"]["CAPD_STATE_DIR"] == (
        "/Users/alice/Library/Application Support/capd")


def test_install_units_refuses_a_capd_the_service_user_cannot_run(tmp_path: Path) -> None:
    """A system install from a capd behind a private folder (a venv in /root, say): exit 1,
    saying which folder and how to install capd where the service user can run it."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    venv_bin = private / "bin"
    venv_bin.mkdir()
    (venv_bin / "capd").symlink_to(PROGRAM)
    (venv_bin / "python").symlink_to(sys.executable)
    done = subprocess.run([str(venv_bin / "python"), "-m", "capd", "install-units"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert f"cannot run {venv_bin / 'capd'}" in done.stderr
    assert str(private) in done.stderr
    assert "/opt/capd/bin/capd install-units" in done.stderr


def test_install_units_that_cannot_write_exits_1_with_a_sentence(tmp_path: Path) -> None:
    """A destination that cannot be made: `capd: cannot write …: <reason>`, exit 1."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = run("install-units", "--dest", str(blocker / "units"))
    assert (done.returncode, done.stdout) == (1, "")
    stderr = without_warning(done.stderr)
    assert stderr.startswith(f"capd: cannot write {blocker / 'units'}: ")
    assert "Traceback" not in stderr
    assert stderr.count("\n") == 1


def test_install_units_refuses_a_capd_the_sandbox_hides() -> None:
    """A capd any user may run but under /tmp (or /home, /root): the service's PrivateTmp
    (ProtectHome) hides it, so the system install is refused, saying which setting."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="capd-venv-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        (folder / "bin").mkdir(mode=0o755)
        (folder / "bin" / "capd").symlink_to(PROGRAM)
        (folder / "bin" / "python").symlink_to(sys.executable)
        done = subprocess.run([str(folder / "bin" / "python"), "-m", "capd", "install-units"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 1, done.stderr
        assert "PrivateTmp=yes" in done.stderr
        assert "hides /tmp" in done.stderr
        assert not Path("/etc/systemd/system/capd.service").is_symlink()
    finally:
        shutil.rmtree(folder)


def test_install_units_notify_reload_installs_that_service_as_capd_service(
        tmp_path: Path) -> None:
    done = run("install-units", "--notify-reload", "--dest", str(tmp_path))
    assert done.returncode == 0, done.stderr
    service = (tmp_path / "capd.service").read_text()
    assert "Type=notify-reload" in service
    assert f"ExecStart={PROGRAM} serve" in service
    assert not (tmp_path / "capd-notify-reload.service").exists()
    user = run("install-units", "--user", "--notify-reload")
    assert user.returncode == 2
    assert "--notify-reload is for the system units" in user.stderr


def test_install_units_example_copies_the_bundled_example_once(tmp_path: Path) -> None:
    """--example puts the bundled example where the units read their config (here the
    per-user one), and never over a capd.toml that is there."""
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    done = run("install-units", "--user", "--example", env=env)
    assert done.returncode == 0, done.stderr
    target = tmp_path / "capd"
    assert (target / "capd.toml").read_bytes() == (EXAMPLES / "capd.toml").read_bytes()
    assert (target / "vault").is_dir()
    assert f"copied the bundled example to {target}" in done.stderr
    (target / "capd.toml").write_text("# mine\n")
    again = run("install-units", "--user", "--example", env=env)
    assert again.returncode == 0, again.stderr
    assert (target / "capd.toml").read_text() == "# mine\n"
    assert "it exists; the example was not copied" in again.stderr
    both = run("install-units", "--example", "--dest", str(tmp_path / "d"))
    assert both.returncode == 2
    assert "not into --dest" in both.stderr


def test_check_and_serve_without_a_config_name_the_bundled_example(tmp_path: Path) -> None:
    """Outside a checkout there is no examples/ folder: the hint names where the package
    installed the example, a path that exists; check fails as serve does."""
    for command in ("check", "serve"):
        done = subprocess.run([*CAPD, command], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path, env={k: v for k, v in os.environ.items()
                                                 if k != "CAPD_CONFIG"}, check=False)
        assert done.returncode == 1, done.stderr
        hinted = done.stderr.split("--config ")[-1].rstrip(")\n")
        assert Path(hinted).is_absolute()
        assert Path(hinted).is_file(), hinted


def test_a_capd_on_a_python_the_service_cannot_reach_is_refused() -> None:
    """The capd script may be anywhere: the Python it runs on counts too (a venv made from a
    Python under /root links there, and the service could not start it)."""
    from capd.sidecar.client._units import service_cannot_run

    interpreter = Path(sys.executable).resolve()
    why = service_cannot_run(Path("/usr/bin/env"))  # a program any user may run
    hidden = any(Path(folder) in interpreter.parents for folder in ("/tmp", "/root", "/home"))
    if hidden:
        assert why is not None
        assert f"its Python {interpreter}" in why
    else:
        assert why is None
