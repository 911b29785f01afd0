"""A markdown-notes capability pack: ops for capd's bundled example.

Each op takes a pydantic parameter model first and the declaration's
``options`` as keyword arguments.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, Field

from registry import op

NOTE_NAME = r"^[A-Za-z0-9][A-Za-z0-9 _-]{0,99}$"


class AppendParams(BaseModel):
    note: str = Field(pattern=NOTE_NAME, description="Note name, without the .md suffix.")
    line: str = Field(min_length=1, max_length=4000, pattern=r"^[^\n]*$",
                      description="The line to append (no newlines).")


class CreateParams(BaseModel):
    note: str = Field(pattern=NOTE_NAME, description="Note name, without the .md suffix.")
    title: str | None = Field(None, max_length=200, description="Optional heading for the note.")


class SearchParams(BaseModel):
    query: str = Field(min_length=1, description="Text to look for, case-insensitive.")
    limit: int = Field(10, ge=1, le=100, description="Most matches to return.")


class SnapshotParams(BaseModel):
    message: str = Field("capd snapshot", min_length=1, description="The commit message.")


class PublishParams(BaseModel):
    note: str = Field(pattern=NOTE_NAME, description="Note name, without the .md suffix.")


def _note_path(vault: str, note: str) -> Path:
    return Path(vault) / f"{note}.md"


@op("notes.append")
def append_line(params: AppendParams, *, vault: str) -> dict[str, Any]:
    path = _note_path(vault, params.note)
    if not path.is_file():
        raise FileNotFoundError(f"note {params.note!r} does not exist; create it first")
    with path.open("a", encoding="utf-8") as handle:
        handle.write(params.line + "\n")
    return {"note": params.note, "path": str(path)}


@op("notes.create")
def create_note(params: CreateParams, *, vault: str) -> dict[str, Any]:
    path = _note_path(vault, params.note)
    with path.open("x", encoding="utf-8") as handle:
        if params.title:
            handle.write(f"# {params.title}\n\n")
    return {"note": params.note, "path": str(path)}


@op("notes.search")
def search_notes(params: SearchParams, *, vault: str) -> dict[str, Any]:
    needle = params.query.lower()
    matches: list[dict[str, Any]] = []
    for path in sorted(Path(vault).glob("*.md")):
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if needle in text.lower():
                matches.append({"note": path.stem, "line": number, "text": text})
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
    body = _note_path(vault, params.note).read_text(encoding="utf-8")
    async with aiohttp.ClientSession() as session, session.put(
        f"{server}/notes/{params.note}", data=body.encode()
    ) as response:
        response.raise_for_status()
    return {"note": params.note, "published": True}
