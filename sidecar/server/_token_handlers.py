"""Handlers for bearer tokens (the operator's): create, list, revoke (see ``_tokens.py``)."""

from __future__ import annotations

import secrets
import time

import structlog

from .._args import Params
from .._errors import BadRequest, UnknownProfile, UnknownToken
from .._table import TokenCreateIn, TokenIn
from ._durations import parse_duration
from ._services import Context, Handler, Reply
from ._tokens import TokenProblem

log = structlog.get_logger("capd.tokens")


async def token_create(ctx: Context, a: TokenCreateIn) -> Reply:
    """Make a token bound to a profile and/or an allow list (the token is shown once)."""
    profile = a.profile or None
    allow = tuple(sorted({n.strip().removeprefix("@") for item in a.allow
                          for n in item.split(",") if n.strip()}))
    if profile is None and not allow:
        raise BadRequest("a token reaches what a profile ([profiles.NAME] in capd.toml) or an "
                         "allow list names: give --profile or --allow")
    profiles = ctx.services.policy.authority.profiles
    if profile is not None and profile not in profiles:
        raise UnknownProfile(str(profile), list(profiles))
    channel = a.channel or None
    ttl_s = parse_duration(a.ttl) if a.ttl else None
    name = a.name or f"{profile or 'allow'}-{secrets.token_hex(2)}"
    try:
        record, token = ctx.services.tokens.create(str(name), profile=profile, allow=allow,
                                           channel=channel, ttl_s=ttl_s)
    except TokenProblem as exc:
        raise BadRequest(str(exc)) from exc
    log.info("token_created", token=record.name, id=record.id, profile=profile,
             allow=len(allow), by_uid=ctx.caller.uid)
    return Reply(200, {**record.view(time.time()), "token": token,
                       "note": "the token is shown this once; capd keeps only its hash"})


async def token_list(ctx: Context, _: Params) -> Reply:
    """Every token, newest first (never a token or its hash)."""
    now = time.time()
    return Reply(200, {"tokens": [r.view(now) for r in ctx.services.tokens.records()]})


async def token_revoke(ctx: Context, a: TokenIn) -> Reply:
    """Revoke a token by id or name: refused from its next request on."""
    try:
        record = ctx.services.tokens.revoke(a.token)
    except TokenProblem as exc:
        raise UnknownToken(str(exc)) from exc
    log.info("token_revoked", token=record.name, id=record.id, by_uid=ctx.caller.uid)
    return Reply(200, record.view(time.time()))


TOKEN_HANDLERS: dict[str, Handler] = {"token_create": token_create, "token_list": token_list,
                  "token_revoke": token_revoke}
