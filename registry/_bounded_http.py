"""The HTTP client of a streamable-HTTP upstream: a JSON answer is not read past a limit.

The SDK reads a JSON answer whole (``response.aread()``) and bounds only SSE events.
Behind this client's transport, the body of an ``application/json`` answer stops at
``max_result_bytes`` with a :class:`AnswerTooLarge` (an ``httpx2.StreamError``), which
the SDK answers to the request as an error naming it, so the call fails as
``result_too_large`` and the session stays usable. Other answers (the SSE streams) pass
as they are.

It also tells which call a server's message belongs to. Over streamable HTTP a server
sends a request (sampling, elicitation) or a log line that belongs to a call on that
call's own response stream; the SDK's client forwards it without saying which stream it
came on. A ``tools/call`` capd sends carries its call's token in ``_meta``
(:data:`CALL_META`); :class:`Relations` reads the SSE stream answering it as it passes
and records, for each server request id and each log line on it, that token.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson

from ._relations import CALL_META, Relations

REQUEST_TIMEOUT_S = 30.0
SSE_READ_TIMEOUT_S = 300.0
"""The HTTP timeouts of an upstream session: the SDK's own defaults (written here, not
read from its private ``_httpx_utils``)."""


class AnswerTooLarge(httpx2.StreamError):
    """A JSON answer went past the limit; it was not read further."""


class _Bounded(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for piece in self._inner:
            seen += len(piece)
            if seen > self._limit:
                raise AnswerTooLarge(f"result_too_large: the answer is over {self._limit} "
                                     "bytes (max_result_bytes); it was not read further")
            yield piece

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Observed(httpx2.AsyncByteStream):
    """An SSE stream passed on as it is, each event's JSON shown to ``relations``."""

    def __init__(self, inner: Any, relations: Relations, call: int) -> None:
        self._inner, self._relations, self._call = inner, relations, call

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        data: list[bytes] = []
        async for piece in self._inner:
            pending += piece
            *lines, pending = pending.split(b"\n")
            for line in lines:
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    data.append(line[5:].removeprefix(b" "))
                elif not line and data:
                    with contextlib.suppress(ValueError):
                        self._relations.seen(orjson.loads(b"\n".join(data)), self._call)
                    data = []
            yield piece

    async def aclose(self) -> None:
        await self._inner.aclose()


def _call_of(request: httpx2.Request) -> int | None:
    """The capd call token a ``tools/call`` POST names in its ``_meta``, if any."""
    if request.method != "POST":
        return None
    try:
        body = orjson.loads(request.content)
        token = body["params"]["_meta"][CALL_META]
    except (ValueError, KeyError, TypeError, httpx2.RequestNotRead):
        return None
    return token if isinstance(token, int) else None


class _BoundedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, limit: int, relations: Relations | None) -> None:
        super().__init__()
        self._limit = limit
        self._relations = relations

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        call = _call_of(request) if self._relations is not None else None
        response = await super().handle_async_request(request)
        kind = response.headers.get("content-type", "")
        if kind.startswith("application/json"):
            response.stream = _Bounded(response.stream, self._limit)
        elif call is not None and kind.startswith("text/event-stream"):
            assert self._relations is not None
            response.stream = _Observed(response.stream, self._relations, call)
        return response


@contextlib.asynccontextmanager
async def bounded_http_client(limit: int, relations: Relations | None = None
                              ) -> AsyncIterator[httpx2.AsyncClient]:
    """An HTTP client with the SDK's timeouts whose JSON answers stop at ``limit`` bytes
    (and, with ``relations``, that records which call each server message came with)."""
    timeout = httpx2.Timeout(REQUEST_TIMEOUT_S, read=SSE_READ_TIMEOUT_S)
    transport = _BoundedTransport(limit, relations)
    async with httpx2.AsyncClient(timeout=timeout, transport=transport) as client:
        yield client
