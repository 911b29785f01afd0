"""The client side: the ``capd`` CLI, the socket client, rendering, the MCP bridge.

Nothing here imports the server (``capd serve`` imports it when it runs).
"""

from ._client import Response, request
from .cli import main

__all__ = ["Response", "main", "request"]
