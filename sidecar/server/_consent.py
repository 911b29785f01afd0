"""Consent grants: an operator's yes to operations, for a while, maybe for one session.

A capability declares ``consent_operations`` (``["vault.write"]``); before it
runs, every one must be covered by a live grant. Grants come from the operator
surface only (``capd consent grant``), never from an agent. They persist in
``consent.json`` in the state directory (written whole to a temporary file,
fsynced and renamed over the old one, so a crash leaves the old or the new
file, never half of one) and expire by their TTL.

A grant's operations are exact names or globs (``vault.*``). A grant without a
session covers every caller; one with a session covers only calls made in it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._errors import SidecarError

FILE_NAME = "consent.json"
FORMAT = 1


class ConsentStoreCorrupt(SidecarError):
    """``consent.json`` cannot be read as capd's grants."""


class UnknownGrant(SidecarError):
    """No grant has that id."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One operator grant."""

    id: str
    operations: tuple[str, ...]
    session: str | None
    granted_at: float
    expires_at: float
    granted_by_uid: int | None = None

    def covers(self, operation: str, session: str | None) -> bool:
        """Whether this grant covers ``operation`` for a call in ``session``."""
        if self.session is not None and self.session != session:
            return False
        if operation in self.operations:
            return True
        return any(fnmatch.fnmatchcase(operation, op) for op in self.operations)

    def view(self, now: float) -> dict[str, Any]:
        """The JSON shape operators see."""
        data = asdict(self)
        data["operations"] = list(self.operations)
        data["expires_in_s"] = round(max(0.0, self.expires_at - now), 3)
        return data


def _parse(raw: bytes) -> list[Grant]:
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not format {FORMAT}")
    return [Grant(id=str(g["id"]), operations=tuple(str(o) for o in g["operations"]),
                  session=g.get("session"), granted_at=float(g["granted_at"]),
                  expires_at=float(g["expires_at"]), granted_by_uid=g.get("granted_by_uid"))
            for g in data["grants"]]


class ConsentStore:
    """The live grants, kept in one JSON file."""

    def __init__(self, path: Path, grants: Iterable[Grant], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._grants = {g.id: g for g in grants}
        # (operations, session) -> when the grants covering them all first run out
        self._covered: dict[tuple[tuple[str, ...], str | None], float] = {}

    @classmethod
    def open(cls, state_dir: Path, *, clock: Callable[[], float] = time.time) -> ConsentStore:
        """Load ``state_dir/consent.json`` (absent: no grants); refuse a damaged file."""
        path = state_dir / FILE_NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path, (), clock=clock)
        try:
            grants = _parse(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConsentStoreCorrupt(
                f"{path} is not a readable capd consent file ({exc}); move it aside and "
                "inspect it — capd never replaces it. Without it, no grant is live.") from exc
        store = cls(path, grants, clock=clock)
        store._drop_expired()
        return store

    def grant(self, operations: Iterable[str], *, ttl_s: float, session: str | None = None,
              granted_by_uid: int | None = None) -> Grant:
        """Record a grant; it is on disk when this returns."""
        ops = tuple(dict.fromkeys(o.strip() for o in operations if o.strip()))
        if not ops:
            raise ValueError("name at least one operation to grant")
        if ttl_s <= 0:
            raise ValueError("the TTL must be positive")
        now = self._clock()
        grant = Grant(id=secrets.token_hex(4), operations=ops, session=session,
                      granted_at=now, expires_at=now + ttl_s, granted_by_uid=granted_by_uid)
        self._drop_expired()
        self._grants[grant.id] = grant
        self._covered.clear()
        self._save()
        return grant

    def revoke(self, grant_id: str) -> Grant:
        """Remove a grant; raise :class:`UnknownGrant` if there is none with that id."""
        grant = self._grants.pop(grant_id, None)
        self._covered.clear()
        if grant is None:
            known = ", ".join(sorted(self._grants)) or "none"
            raise UnknownGrant(f"no consent grant {grant_id!r} (live grants: {known})")
        self._save()
        return grant

    def live(self) -> list[Grant]:
        """Grants not expired, soonest to expire first."""
        self._drop_expired()
        return sorted(self._grants.values(), key=lambda g: g.expires_at)

    def missing(self, operations: Iterable[str], session: str | None) -> list[str]:
        """The operations no live grant covers for ``session`` (in the order asked).

        A full cover is remembered until the first of the grants it rests on expires
        (or any grant is made or revoked): a capability called again and again behind
        one grant is not matched against every grant each time.
        """
        ops = tuple(operations)
        now = self._clock()
        key = (ops, session)
        until = self._covered.get(key)
        if until is not None and now < until:
            return []
        live = [g for g in self._grants.values() if g.expires_at > now]
        missing: list[str] = []
        holds_until = math.inf
        for op in ops:
            covering = [g.expires_at for g in live if g.covers(op, session)]
            if covering:
                holds_until = min(holds_until, max(covering))
            else:
                missing.append(op)
        if not missing:
            if len(self._covered) >= 4096:
                self._covered.clear()
            self._covered[key] = holds_until
        return missing

    def _drop_expired(self) -> None:
        now = self._clock()
        expired = [gid for gid, g in self._grants.items() if g.expires_at <= now]
        for gid in expired:
            del self._grants[gid]
        if expired:
            with contextlib.suppress(OSError):  # pruning may wait for the next write
                self._save()

    def _save(self) -> None:
        grants = [asdict(g) for g in self._grants.values()]  # a tuple is a JSON list
        replace_file(self.path, json.dumps({"format": FORMAT, "grants": grants},
                                           indent=1).encode())


def replace_file(path: Path, body: bytes, mode: int = 0o666) -> None:
    """Make ``body`` the whole of ``path`` (``mode`` for a new file, less the umask): a
    temporary file fsynced, renamed over the old one, and the folder fsynced, so a crash
    leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as handle:
        handle.write(body)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
