"""The HTTP client of a streamable-HTTP upstream: a JSON answer is not read past a limit.

The SDK reads a JSON answer whole (``response.aread()``) and bounds only SSE events.
Behind this client's transport, the body of an ``application/json`` answer stops at
``max_result_bytes`` with a :class:`AnswerTooLarge` (an ``httpx2.StreamError``), which
the SDK answers to the request as an error naming it, so the call fails as
``result_too_large`` and the session stays usable. Other answers (the SSE streams) pass
as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT


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


class _BoundedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, limit: int) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").startswith("application/json"):
            response.stream = _Bounded(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@contextlib.asynccontextmanager
async def bounded_http_client(limit: int) -> AsyncIterator[httpx2.AsyncClient]:
    """An HTTP client with the SDK's timeouts whose JSON answers stop at ``limit`` bytes."""
    timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    async with httpx2.AsyncClient(timeout=timeout, transport=_BoundedTransport(limit)) as client:
        yield client
