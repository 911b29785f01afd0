"""Verifying a mutating call's declared effects: did the write land?

Each effect is checked with the call's parameters (and the capability's
options, which win: a caller never chooses what verification reads)
substituted into it. Each check answers ``present``, ``absent`` or
``unknown`` (it could not decide: a timeout, a 5xx, a permission error). The
walk combines them:

- every effect present → ``verified`` (the write landed; do not call again)
- every effect absent → ``absent`` (safe to replay)
- some present, some absent → ``partial``
- anything unknown → ``unknown`` (back off and verify later)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import os
import re
from collections.abc import Mapping
from concurrent.futures import Executor
from functools import partial
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel

from capd.registry import (
    USER_CODE_FAILURES,
    Capability,
    CommandEffect,
    EffectSpec,
    FileContainsEffect,
    FileExistsEffect,
    HttpEffect,
    OpEffect,
    OpTable,
    render,
)

EffectStatus = Literal["present", "absent", "unknown"]
Verdict = Literal["verified", "absent", "partial", "unknown"]


@dataclasses.dataclass(frozen=True)
class EffectCheck:
    """One effect's verdict and why."""

    kind: str
    status: EffectStatus
    detail: str


@dataclasses.dataclass(frozen=True)
class Verification:
    """The combined verdict over every declared effect."""

    verdict: Verdict
    checks: tuple[EffectCheck, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON view for the attempts table and the API."""
        return {"verdict": self.verdict, "checks": [dataclasses.asdict(c) for c in self.checks]}


def combine(statuses: list[EffectStatus]) -> Verdict:
    """Combine per-effect statuses into one verdict."""
    if not statuses or "unknown" in statuses:
        return "unknown"
    if all(s == "present" for s in statuses):
        return "verified"
    if all(s == "absent" for s in statuses):
        return "absent"
    return "partial"


def _read_bytes(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


# Each check answers (status, detail); check_effect adds the effect's kind.
Answer = tuple[EffectStatus, str]


def _found(found: bool) -> EffectStatus:
    return "present" if found else "absent"


async def _file_contains(effect: FileContainsEffect, values: Mapping[str, Any]) -> Answer:
    path = render(effect.path, values)
    data = await asyncio.to_thread(_read_bytes, path)
    if data is None:
        return "absent", f"{path} does not exist"
    # Bytes exactly as written, lines ended by "\n" only: a line holding "\r", "\x0b",
    # "\x85" or "\u2028" is one line here, as it was when the op wrote it.
    if effect.line is not None:
        line = render(effect.line, values)
        found = line.encode("utf-8", "surrogateescape") in data.split(b"\n")
        what = f"line {line!r}"
    else:
        assert effect.regex is not None
        # Substituted values are escaped: a parameter is matched literally.
        pattern = render(effect.regex, {k: re.escape(str(v)) for k, v in values.items()})
        text = data.decode("utf-8", "surrogateescape")
        found = re.search(pattern, text, re.MULTILINE) is not None
        what = f"pattern {pattern!r}"
    return _found(found), f"{path} {'contains' if found else 'lacks'} {what}"


async def _file_exists(effect: FileExistsEffect, values: Mapping[str, Any]) -> Answer:
    path = render(effect.path, values)
    exists = await asyncio.to_thread(os.path.exists, path)
    return _found(exists), f"{path} {'exists' if exists else 'does not exist'}"


def _field(document: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if isinstance(document, dict) and part in document:
            document = document[part]
        elif isinstance(document, list) and part.isdigit() and int(part) < len(document):
            document = document[int(part)]
        else:
            raise KeyError(dotted)
    return document


async def _http(effect: HttpEffect, values: Mapping[str, Any],
                options: Mapping[str, Any]) -> Answer:
    # A call's parameter lands in the URL percent-encoded: it can add a path segment's
    # worth of text, never a host, a port, a path or a query of its own. The
    # capability's options (the operator's) are taken as written.
    url = render(effect.url, {k: v if k in options else quote(str(v), safe="")
                              for k, v in values.items()})
    import aiohttp  # only when an http effect is checked (the import costs ~0.1 s)

    async with aiohttp.ClientSession() as session, session.request(
            effect.method, url, allow_redirects=False) as response:
        answered = f"{effect.method} {url} answered {response.status}"
        if response.status in (404, 410):
            return "absent", answered
        if response.status != effect.expect_status:
            return "unknown", f"{answered}, expected {effect.expect_status}"
        if effect.json_field is None:
            return "present", answered
        document = await response.json(content_type=None)
    expected = effect.json_equals
    if isinstance(expected, str):
        expected = render(expected, values)
    try:
        actual = _field(document, effect.json_field)
    except KeyError:
        return "absent", f"{url}: no field {effect.json_field!r}"
    return (_found(actual == expected or str(actual) == str(expected)),
            f"{url}: {effect.json_field} is {actual!r}, expected {expected!r}")


async def _command(effect: CommandEffect, values: Mapping[str, Any]) -> Answer:
    argv = [render(a, values) for a in effect.argv]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
    except FileNotFoundError:
        return "unknown", f"{argv[0]!r} not found"
    try:
        code = await proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.wait())
        raise
    return ("present" if code == 0 else "absent" if code == 1 else "unknown",
            f"{' '.join(argv)!r} exited {code}")


async def _op(effect: OpEffect, params: BaseModel, cap: Capability, ops: OpTable,
              executor: Executor | None) -> Answer:
    spec = ops.ops.get(effect.op)
    if spec is None:
        return "unknown", f"verify op {effect.op!r} is not registered"
    if inspect.iscoroutinefunction(spec.func):
        outcome = await spec.func(params, **cap.options)
    else:  # a plain verifier runs off the loop; the effect's timeout still holds
        outcome = await asyncio.get_running_loop().run_in_executor(
            executor, partial(spec.func, params, **cap.options))
        if inspect.isawaitable(outcome):
            outcome = await outcome
    if outcome is None:
        return "unknown", f"{effect.op} could not decide"
    return _found(bool(outcome)), f"{effect.op} returned {bool(outcome)}"


async def check_effect(effect: EffectSpec, cap: Capability, params: BaseModel, ops: OpTable,
                       executor: Executor | None = None) -> EffectCheck:
    """Check one effect under its timeout; failures to decide are ``unknown``, never raised.

    A plain verify op runs on ``executor`` (the loop's default when None).
    """
    values = {**params.model_dump(), **cap.options}
    try:
        async with asyncio.timeout(effect.timeout_s):
            match effect:
                case FileContainsEffect():
                    answer = await _file_contains(effect, values)
                case FileExistsEffect():
                    answer = await _file_exists(effect, values)
                case HttpEffect():
                    answer = await _http(effect, values, cap.options)
                case CommandEffect():
                    answer = await _command(effect, values)
                case OpEffect():
                    answer = await _op(effect, params, cap, ops, executor)
                case _:  # pragma: no cover
                    raise AssertionError(f"unhandled effect kind {effect.kind}")
    except TimeoutError:
        answer = "unknown", f"timed out after {effect.timeout_s:g}s"
    except USER_CODE_FAILURES as exc:  # a check that cannot decide says so
        answer = "unknown", f"{type(exc).__name__}: {exc}"
    return EffectCheck(effect.kind, *answer)


async def verify_post_write_effects(cap: Capability, params: BaseModel,
                                   ops: OpTable | None = None, *,
                                   executor: Executor | None = None) -> Verification:
    """Check every declared effect of ``cap`` for this call, concurrently, and combine them."""
    table = ops or OpTable()
    checks = await asyncio.gather(
        *(check_effect(e, cap, params, table, executor) for e in cap.effects))
    return Verification(combine([c.status for c in checks]), tuple(checks))
