"""Bearer tokens for the MCP front door over HTTP: each one a grant, stored hashed.

A token is ``capd_<id>_<secret>``: ``id`` names its record, ``secret`` (32 random
bytes, URL-safe base64) is never stored — only its SHA-256, compared with
``hmac.compare_digest``. The records live in ``<state_dir>/tokens.json`` (mode
0600, replaced atomically on every change), so they outlive a restart; a revoked
token is refused on its next request (the check reads the record every time).

A record names what its holder may reach, the same way a ``[[peers]]`` binding does
for a uid: a ``profile`` of ``capd.toml`` (read at each request, so a reload that
changes the profile changes what the token reaches), or an ``allow`` list of
capability names, or both, and a ``channel``; its holder is always an agent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from ._consent import replace_file

_TOKEN = re.compile(r"^capd_([A-Za-z0-9]{12})_([A-Za-z0-9_-]{43})$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
MAX_TOKENS = 10_000


class TokenRefused(Exception):
    """The presented token does not admit its bearer (401); the message says why."""


class TokenProblem(ValueError):
    """A token cannot be made or found as asked (400/404); the message says why."""


@dataclass(frozen=True)
class TokenRecord:
    """One token as stored: everything but its secret."""

    id: str
    name: str
    hash: str
    created_at: float
    profile: str | None = None
    allow: tuple[str, ...] = ()
    channel: str | None = None
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = field(default=None, compare=False)

    def view(self, now: float) -> dict[str, Any]:
        """The record as the API shows it (never the hash)."""
        state = ("revoked" if self.revoked_at is not None else
                 "expired" if self.expires_at is not None and now >= self.expires_at else
                 "active")
        data = asdict(self)
        del data["hash"]
        data["allow"] = list(self.allow)
        data["state"] = state
        return data


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore:
    """The tokens of one state directory."""

    def __init__(self, path: Path, clock: Any = time.time) -> None:
        self.path = path
        self._clock = clock
        self._records: dict[str, TokenRecord] = {}
        self._loaded_mtime: float | None = None
        # when each token last admitted a request: kept here (a request writes nothing),
        # written to the file with the next change or listing
        self._used: dict[str, float] = {}

    def _load(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._records, self._loaded_mtime = {}, None
            return
        if stat.st_mtime == self._loaded_mtime:
            return
        try:
            raw = orjson.loads(self.path.read_bytes())
            records = {r["id"]: TokenRecord(**{**r, "allow": tuple(r.get("allow", ()))})
                       for r in raw["tokens"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TokenProblem(f"{self.path} cannot be read as capd's token file ({exc}); "
                               "move it aside and create the tokens again") from exc
        self._records, self._loaded_mtime = records, stat.st_mtime

    def _with_use(self) -> bool:
        """Fold the uses seen since the last save into the records; whether any was new."""
        changed = False
        for token_id, used_at in self._used.items():
            record = self._records.get(token_id)
            if record is not None and (record.last_used_at or 0) < used_at:
                self._records[token_id] = replace(record, last_used_at=used_at)
                changed = True
        self._used.clear()
        return changed

    def _save(self) -> None:
        self._with_use()
        replace_file(self.path, orjson.dumps(
            {"tokens": [asdict(r) for r in self._records.values()]},
            option=orjson.OPT_INDENT_2), 0o600)
        self._loaded_mtime = self.path.stat().st_mtime

    def create(self, name: str, *, profile: str | None = None, allow: tuple[str, ...] = (),
               channel: str | None = None, ttl_s: float | None = None
               ) -> tuple[TokenRecord, str]:
        """A new token: its record and the token itself (shown once, never stored)."""
        self._load()
        if not _NAME.match(name):
            raise TokenProblem(f"token name {name!r}: 1-64 lower-case letters, digits, '.', "
                               "'_' or '-', starting with a letter or digit")
        if any(r.name == name and r.revoked_at is None for r in self._records.values()):
            raise TokenProblem(f"a token named {name!r} exists; revoke it first or pick "
                               "another name")
        if len(self._records) >= MAX_TOKENS:
            raise TokenProblem(f"{MAX_TOKENS} tokens are stored; revoke some first")
        if ttl_s is not None and ttl_s <= 0:
            raise TokenProblem("a token's ttl must be above 0")
        token_id = "".join(secrets.choice("abcdefghijkmnpqrstuvwxyz23456789")
                           for _ in range(12))
        secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        now = self._clock()
        record = TokenRecord(token_id, name, _digest(secret), now, profile, tuple(allow),
                             channel, None if ttl_s is None else now + ttl_s)
        self._records[token_id] = record
        self._save()
        return record, f"capd_{token_id}_{secret}"

    def records(self) -> list[TokenRecord]:
        """Every record, newest first, each with when it last admitted a request."""
        self._load()
        if self._with_use():
            self._save()
        return sorted(self._records.values(), key=lambda r: r.created_at, reverse=True)

    def revoke(self, key: str) -> TokenRecord:
        """Revoke the token with this id or (active) name; raise :class:`TokenProblem`."""
        self._load()
        record = self._records.get(key) or next(
            (r for r in self._records.values() if r.name == key and r.revoked_at is None),
            None)
        if record is None:
            raise TokenProblem(f"no token {key!r}; capd token list shows them")
        if record.revoked_at is None:
            record = replace(record, revoked_at=self._clock())
            self._records[record.id] = record
            self._save()
        return record

    def check(self, presented: str | None) -> TokenRecord:
        """The record of a presented token that admits its bearer now; raise
        :class:`TokenRefused` saying why not."""
        if not presented:
            raise TokenRefused("this endpoint needs a bearer token (Authorization: Bearer "
                               "capd_...); an operator makes one with: capd token create")
        match = _TOKEN.match(presented)
        if match is None:
            raise TokenRefused("the bearer token is not a capd token")
        try:
            self._load()
        except TokenProblem as exc:  # every token is refused until the file is readable
            raise TokenRefused(str(exc)) from exc
        record = self._records.get(match.group(1))
        # compared in constant time; an unknown id is compared against a dummy alike
        expected = record.hash if record is not None else "0" * 64
        if not hmac.compare_digest(_digest(match.group(2)), expected) or record is None:
            raise TokenRefused("the bearer token is not known")
        if record.revoked_at is not None:
            raise TokenRefused(f"token {record.name!r} was revoked")
        now = self._clock()
        if record.expires_at is not None and now >= record.expires_at:
            raise TokenRefused(f"token {record.name!r} has expired; ask for a new one")
        self._used[record.id] = now
        return record
