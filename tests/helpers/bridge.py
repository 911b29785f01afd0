"""``capd mcp`` as an MCP client launches it, and the SDK's session to it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


@asynccontextmanager
async def bridge(socket: Path, *extra: str, seen: list[str] | None = None,
                 **callbacks: Any) -> AsyncIterator[ClientSession]:
    """The bridge as a subprocess, and an initialized client session to it (``callbacks``:
    the session's sampling, elicitation or logging callbacks)."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "capd", "mcp", "--socket", str(socket),
                                         *extra])

    async def on_message(message: Any) -> None:
        if seen is not None:
            seen.append(type(message).__name__)

    async with stdio_client(params) as (read, write), ClientSession(
            read, write, message_handler=on_message, **callbacks) as session:
        await session.initialize()
        yield session


BRIEF = {"search_capabilities", "get_capability", "invoke_capability"}
"""The meta tools listed by default (``[mcp] tools = "brief"``)."""


def data(result: types.CallToolResult) -> Any:
    assert result.structured_content is not None, result.content
    return result.structured_content
