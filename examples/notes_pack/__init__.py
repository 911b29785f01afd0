"""A markdown-notes capability pack: ops for capd's bundled example.

Each op takes a pydantic parameter model first and the declaration's
``options`` as keyword arguments.

People copy this pack, so it shows the care an op that touches files needs:
a note is opened without following a symlink (``O_NOFOLLOW``), so an entry
``vault/evil.md -> /etc/passwd`` is refused instead of read or written, and a
title cannot smuggle a line break into the Markdown. The vault folder itself
may be a symlink; that is the operator's choice, not a caller's.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from capd.registry import PermanentToolError, op

NOTE_NAME = r"^[A-Za-z0-9][A-Za-z0-9 _-]{0,99}$"
# Every character str.splitlines() breaks on, so a title stays one Markdown heading.
# Written with escapes that Rust's regex (pydantic), Python's re and ECMA-262 (JSON Schema)
# all read the same way.
ONE_LINE = r"^[^\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]*$"

# O_NONBLOCK keeps open() of a FIFO planted in the vault from hanging the op; it
# changes nothing for a regular file.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK


class AppendParams(BaseModel):
    note: str = Field(pattern=NOTE_NAME, description="Note name, without the .md suffix.")
    # Only \n is refused: the op writes the line byte for byte, \r included.
    line: str = Field(min_length=1, max_length=4000, pattern=r"^[^\n]*$",
                      description="The line to append (no newlines).")


class CreateParams(BaseModel):
    note: str = Field(pattern=NOTE_NAME, description="Note name, without the .md suffix.")
    title: str | None = Field(None, max_length=200, pattern=ONE_LINE,
                              description="Optional heading for the note (one line).")


class SearchParams(BaseModel):
    query: str = Field(min_length=1, description="Text to look for, case-insensitive.")
    limit: int = Field(10, ge=1, le=100, description="Most matches to return.")


class SnapshotParams(BaseModel):
    message: str = Field("capd snapshot", min_length=1, description="The commit message.")


class PublishParams(BaseModel):
    note: str = Field(pattern=NOTE_NAME, description="Note name, without the .md suffix.")


def _note_path(vault: str, note: str) -> Path:
    return Path(vault) / f"{note}.md"


def _open_note(path: Path, flags: int, note: str) -> int:
    """Open the note at ``path`` with ``flags`` (which hold O_NOFOLLOW); return the descriptor.

    Raises :class:`PermanentToolError` when the entry is a symlink or not a
    regular file; any other :class:`OSError` (a missing note, an existing one
    under O_EXCL) propagates unchanged.
    """
    try:
        fd = os.open(path, flags, 0o666)
    except OSError:
        # O_NOFOLLOW fails with ELOOP (EMLINK on FreeBSD) and O_EXCL with EEXIST on a
        # symlink, a directory with EISDIR, a FIFO nobody reads with ENXIO: the flags
        # keep us safe, and asking the entry itself names the cause on every platform.
        if path.is_symlink():
            raise _symlink_refused(note) from None
        if path.exists() and not path.is_file():
            raise _not_a_file(note) from None
        raise
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise _not_a_file(note)
    return fd


def _symlink_refused(note: str) -> PermanentToolError:
    return PermanentToolError(
        f"note {note!r} is a symlink; capd refuses to follow it out of the vault")


def _not_a_file(note: str) -> PermanentToolError:
    return PermanentToolError(f"note {note!r} is not a regular file")


def _read_note(path: Path, note: str) -> str:
    """Return the note's text; raise as :func:`_open_note` does."""
    with os.fdopen(_open_note(path, _READ, note), "rb") as handle:
        return handle.read().decode("utf-8")


@op("notes.append")
def append_line(params: AppendParams, *, vault: str) -> dict[str, Any]:
    path = _note_path(vault, params.note)
    try:
        fd = _open_note(path, _APPEND, params.note)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"note {params.note!r} does not exist; create it first") from None
    # Bytes, not text: nothing translates the line's \r or adds a platform newline.
    with os.fdopen(fd, "ab") as handle:
        handle.write(params.line.encode("utf-8") + b"\n")
    return {"note": params.note, "path": str(path)}


@op("notes.create")
def create_note(params: CreateParams, *, vault: str) -> dict[str, Any]:
    path = _note_path(vault, params.note)
    with os.fdopen(_open_note(path, _CREATE, params.note), "wb") as handle:
        if params.title:
            handle.write(f"# {params.title}\n\n".encode())
    return {"note": params.note, "path": str(path)}


@op("notes.search")
def search_notes(params: SearchParams, *, vault: str) -> dict[str, Any]:
    needle = params.query.lower()
    matches: list[dict[str, Any]] = []
    for path in sorted(Path(vault).glob("*.md")):
        try:
            text = _read_note(path, path.stem)
        except (PermanentToolError, FileNotFoundError):
            continue  # a symlink or a non-file is not a note; one removed meanwhile is gone
        for number, line in enumerate(text.splitlines(), 1):
            if needle in line.lower():
                matches.append({"note": path.stem, "line": number, "text": line})
                if len(matches) >= params.limit:
                    return {"matches": matches}
    return {"matches": matches}


async def _git(vault: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "git", "-C", vault, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


@op("notes.snapshot")
async def snapshot_vault(params: SnapshotParams, *, vault: str) -> dict[str, Any]:
    if not (Path(vault) / ".git").exists():
        await _git(vault, "init", "-q")
    await _git(vault, "add", "-A")
    code, out = await _git(
        vault, "-c", "user.name=capd", "-c", "user.email=capd@localhost",
        "commit", "-q", "-m", params.message,
    )
    if code != 0 and "nothing to commit" not in out:
        raise RuntimeError(f"git commit failed: {out.strip()}")
    _, head = await _git(vault, "rev-parse", "HEAD")
    return {"commit": head.strip(), "changed": code == 0}


@op("notes.publish")
async def publish_note(params: PublishParams, *, vault: str, server: str) -> dict[str, Any]:
    """PUT the note to the sync server: HTTP on the Unix socket ``server``."""
    import aiohttp  # here, not at the top: importing it costs the daemon's start ~0.1 s

    body = await asyncio.to_thread(_read_note, _note_path(vault, params.note), params.note)
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=server)) as session, \
            session.put(f"http://sync-server/notes/{params.note}", data=body.encode()
                        ) as response:
        response.raise_for_status()
    return {"note": params.note, "published": True}
