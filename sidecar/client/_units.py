"""``capd install-units``: the service files shipped in the package, printed or written.

The wheel carries ``systemd/`` (the checkout's folder, linked into the ``capd``
package) so that an operator who installed capd from an index has the same
units the README describes. Three sets:

- system (the default): ``capd.service`` (``--notify-reload``: the ``Type=notify-reload``
  one, systemd >= 253) and ``capd.socket`` for ``/etc/systemd/system``, the sysusers.d
  entry for ``/etc/sysusers.d``;
- ``--user``: the per-user units for ``~/.config/systemd/user``;
- ``--launchd`` (the default on macOS): the LaunchAgent for
  ``~/Library/LaunchAgents``, its ``/Users/USERNAME`` replaced by the home folder.

``--dest DIR`` puts every file of the set in DIR instead (for packaging).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path


@dataclass(frozen=True)
class UnitFile:
    """One file to install: its text and where it goes."""

    target: Path
    text: str


@dataclass(frozen=True)
class UnitSet:
    """The files of one kind of installation and what to run after writing them."""

    files: tuple[UnitFile, ...]
    next_step: str


def _packaged(relative: str) -> str:
    """The text of ``systemd/<relative>`` as shipped in the ``capd`` package."""
    return (files("capd") / "systemd" / relative).read_text(encoding="utf-8")


def _config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")


PACKAGED_PROGRAMS = ("/usr/local/bin/capd", "%h/.local/bin/capd",
                     "/Users/USERNAME/.local/bin/capd")
"""Where the packaged units expect the capd program; :func:`unit_set` puts the real one."""


def running_capd() -> Path | None:
    """The ``capd`` program this process runs as: the script beside the interpreter (a
    venv's ``bin/capd``), else the one on the command line; None when neither is one."""
    beside = Path(sys.executable).parent / "capd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    named = Path(sys.argv[0])
    return named.resolve() if named.name == "capd" and named.is_file() else None


def unusable_by_others(program: Path) -> Path | None:
    """The first part of ``program``'s path another user cannot pass or run (a private
    home, a 0700 venv), or None when any user may run it."""
    for part in (*reversed(program.parents), program):
        try:
            mode = part.stat().st_mode
        except OSError:
            return part
        if not mode & 0o001:
            return part
    return None


HIDDEN_FROM_SERVICE = ("/tmp", "/var/tmp", "/home", "/root", "/run/user")
"""Folders the system unit's sandbox hides from the service (``PrivateTmp=yes``,
``ProtectHome=yes``): a capd installed under one cannot start as the service."""


def hidden_from_service(program: Path) -> str | None:
    """Why the system service could not run ``program`` (a folder its sandbox hides),
    else None."""
    for folder in HIDDEN_FROM_SERVICE:
        if program == Path(folder) or Path(folder) in program.parents:
            setting = "PrivateTmp=yes" if folder.endswith("tmp") else "ProtectHome=yes"
            return f"the service's sandbox ({setting}) hides {folder}"
    return None


def service_cannot_run(program: Path) -> str | None:
    """Why the system service could not run ``program``: it, or the Python it runs on, is
    behind a folder other users cannot enter, or in one the unit's sandbox hides. None when
    the service can."""
    interpreter = Path(sys.executable).resolve()  # a venv's python links to its base
    for path, what in ((program, str(program)), (interpreter, f"its Python {interpreter}")):
        blocked = unusable_by_others(path)
        if blocked is not None:
            return f"{what}: {blocked} is closed to other users"
        hidden = hidden_from_service(path)
        if hidden is not None:
            return f"{what}: {hidden}"
    return None


def systemd_version() -> int | None:
    """The installed systemd's version (``systemctl --version``), or None."""
    import subprocess

    try:
        done = subprocess.run(["systemctl", "--version"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    words = done.stdout.split()
    return int(words[1]) if len(words) > 1 and words[1].isdigit() else None


def example_config_target(*, user: bool) -> Path:
    """Where ``--example`` copies the bundled example: /etc/capd, or
    ``~/.config/capd`` for the per-user units."""
    return _config_home() / "capd" if user else Path("/etc/capd")


def copy_example(target: Path) -> bool:
    """Copy the bundled example (config, declarations, the notes pack, its vault) into
    ``target``; False, copying nothing, when ``target`` already has a ``capd.toml``."""
    import shutil
    from importlib.resources import as_file

    if (target / "capd.toml").exists():
        return False
    with as_file(files("capd") / "examples") as source:
        shutil.copytree(source, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return True


def unit_set(*, user: bool, launchd: bool, dest: Path | None,
             program: Path | None = None, notify_reload: bool = False) -> UnitSet:
    """The files for a system, ``user`` or ``launchd`` install, under ``dest`` when given,
    each naming ``program`` as the capd to run (the packaged path when None);
    ``notify_reload`` installs the ``Type=notify-reload`` service (systemd >= 253) as
    ``capd.service``.

    Raises :class:`FileNotFoundError` when the package lacks its ``systemd/`` data.
    """
    sources: list[tuple[str, Path]]
    if launchd:
        home = str(Path.home())
        agents = Path.home() / "Library" / "LaunchAgents"
        plist = _with_program(_packaged("dev.capd.capd.plist"), program).replace(
            "/Users/USERNAME", home)
        target = (dest or agents) / "dev.capd.capd.plist"
        return UnitSet((UnitFile(target, plist),),
                       f"launchctl bootstrap gui/$(id -u) {target}")
    if user:
        folder = _config_home() / "systemd" / "user"
        sources = [("user/capd.service", folder / "capd.service"),
                   ("user/capd.socket", folder / "capd.socket")]
        step = ("systemctl --user daemon-reload && "
                "systemctl --user enable --now capd.socket capd.service")
    else:
        folder = Path("/etc/systemd/system")
        service = "capd-notify-reload.service" if notify_reload else "capd.service"
        sources = [(service, folder / "capd.service"),
                   ("capd.socket", folder / "capd.socket"),
                   ("capd.sysusers.conf", Path("/etc/sysusers.d/capd.conf"))]
        step = ("systemd-sysusers && systemctl daemon-reload && "
                "systemctl enable --now capd.socket capd.service")
    unit_files = tuple(UnitFile(dest / target.name if dest else target,
                                _with_program(_packaged(source), program))
                       for source, target in sources)
    return UnitSet(unit_files, step)


def _with_program(text: str, program: Path | None) -> str:
    if program is None:
        return text
    for packaged in PACKAGED_PROGRAMS:
        text = text.replace(packaged, str(program))
    return text


def render_units(units: UnitSet) -> str:
    """Every file of ``units`` after a ``# <target>`` line, for reading or review."""
    return "\n".join(f"# {unit.target}\n{unit.text}" for unit in units.files)


def write_units(units: UnitSet) -> list[Path]:
    """Write each file (mode 0644, parents made), replacing it whole; return the targets.

    Raises :class:`OSError` (permission, read-only file system) at the first file that
    cannot be written.
    """
    for unit in units.files:
        write_atomically(unit.target, unit.text, mode=0o644)
    return [unit.target for unit in units.files]


def write_atomically(target: Path, text: str, *, mode: int | None = None,
                     folder_mode: int = 0o777) -> None:
    """Write ``text`` to ``target`` under a temporary name (its folder made with
    ``folder_mode`` if missing), then rename it into place, so that it is never seen half
    written; ``mode`` when given, else 0600. Raises :class:`OSError`, leaving no scratch file.
    """
    target.parent.mkdir(mode=folder_mode, parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        if mode is not None:
            os.chmod(scratch, mode)
        os.replace(scratch, target)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
