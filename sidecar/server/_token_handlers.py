"""Handlers for bearer tokens (the operator's): create, list, revoke (see ``_tokens.py``)."""

from __future__ import annotations

import secrets
import time
from typing import Any

import structlog

from .._errors import BadRequest, UnknownProfile, UnknownToken
from ._durations import parse_duration
from ._services import Context, Reply, TokensView
from ._tokens import TokenProblem

log = structlog.get_logger("capd.tokens")


def _store(ctx: Context) -> TokensView:
    return ctx.services.tokens


def _names(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise BadRequest("allow is a comma-separated list of capability names")
    return tuple(sorted({i.strip().removeprefix("@") for i in items if i.strip()}))


async def token_create(ctx: Context) -> Reply:
    """Make a token bound to a profile and/or an allow list (the token is shown once)."""
    body = ctx.body if isinstance(ctx.body, dict) else {}
    profile = body.get("profile") or None
    allow = _names(body.get("allow"))
    if profile is None and not allow:
        raise BadRequest("a token reaches what a profile ([profiles.NAME] in capd.toml) or an "
                         "allow list names: give --profile or --allow")
    profiles = ctx.services.policy.authority.profiles
    if profile is not None and profile not in profiles:
        raise UnknownProfile(str(profile), list(profiles))
    channel = body.get("channel") or None
    ttl = body.get("ttl")
    ttl_s = parse_duration(str(ttl)) if ttl not in (None, "") else None
    name = body.get("name") or f"{profile or 'allow'}-{secrets.token_hex(2)}"
    try:
        record, token = _store(ctx).create(str(name), profile=profile, allow=allow,
                                           channel=channel, ttl_s=ttl_s)
    except TokenProblem as exc:
        raise BadRequest(str(exc)) from exc
    log.info("token_created", token=record.name, id=record.id, profile=profile,
             allow=len(allow), by_uid=ctx.caller.uid)
    return Reply(200, {**record.view(time.time()), "token": token,
                       "note": "the token is shown this once; capd keeps only its hash"})


async def token_list(ctx: Context) -> Reply:
    """Every token, newest first (never a token or its hash)."""
    now = time.time()
    return Reply(200, {"tokens": [r.view(now) for r in _store(ctx).records()]})


async def token_revoke(ctx: Context) -> Reply:
    """Revoke a token by id or name: refused from its next request on."""
    try:
        record = _store(ctx).revoke(ctx.path["token"])
    except TokenProblem as exc:
        raise UnknownToken(str(exc)) from exc
    log.info("token_revoked", token=record.name, id=record.id, by_uid=ctx.caller.uid)
    return Reply(200, record.view(time.time()))


TOKEN_HANDLERS = {"token_create": token_create, "token_list": token_list,
                  "token_revoke": token_revoke}
