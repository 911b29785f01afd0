"""Which capd call a streamable-HTTP server's message belongs to (see ``_bounded_http``).

Kept apart from the HTTP client so that what an upstream session needs to route a
message imports nothing of httpx.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson

CALL_META = "io.capd/call"
"""The ``_meta`` key of a ``tools/call`` that names the capd call making it."""
_KEPT = 4096


class Relations:
    """Which capd call each server request (by its id) and log line came with."""

    def __init__(self) -> None:
        self._requests: OrderedDict[Any, int] = OrderedDict()
        self._logs: OrderedDict[bytes, int] = OrderedDict()

    def call_of_request(self, request_id: Any) -> int | None:
        """The call a server request came with (on that call's stream); None: none."""
        return self._requests.pop(request_id, None)

    def call_of_log(self, params: Any) -> int | None:
        """The call a log line (its ``notifications/message`` params) came with."""
        return self._logs.pop(_log_key(params), None)

    def seen(self, message: Any, call: int) -> None:
        if not isinstance(message, dict):
            return
        method = message.get("method")
        if method is None:
            return
        if "id" in message:
            self._keep(self._requests, message["id"], call)
        elif method == "notifications/message":
            self._keep(self._logs, _log_key(message.get("params")), call)

    @staticmethod
    def _keep(book: OrderedDict[Any, int], key: Any, call: int) -> None:
        book[key] = call
        while len(book) > _KEPT:
            book.popitem(last=False)


def _log_key(params: Any) -> bytes:
    if isinstance(params, dict):
        params = {k: params.get(k) for k in ("level", "logger", "data")}
    elif params is not None:
        params = {k: getattr(params, k, None) for k in ("level", "logger", "data")}
        params["level"] = str(params["level"]) if params["level"] is not None else None
    return orjson.dumps(params, option=orjson.OPT_SORT_KEYS, default=str)


