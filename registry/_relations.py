"""Which capd call an upstream server's request or log line belongs to.

:class:`CallsInFlight` holds the calls in flight to one server and answers whose a
server's message is: over streamable HTTP the call's own response stream says
(:class:`Relations`, fed by ``_bounded_http``); over stdio a message names no call,
so it is the one call in flight's, and only when no other call overlapped it.
Kept apart from the HTTP client so that what an upstream session needs to route a
message imports nothing of httpx.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson

from ._events import CallEvents, CannotAsk

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


class CallsInFlight:
    """The calls in flight to one server, each with its caller's stream (None: the caller
    has none), and which of them a server's request or log line belongs to."""

    def __init__(self, tool_id: str, relations: Relations | None) -> None:
        self.tool_id = tool_id
        self.relations = relations  # over streamable HTTP, which call each message came with
        self._calls: dict[int, CallEvents | None] = {}
        self._started = 0
        # calls that another call to this server overlapped (over stdio, whose questions
        # name no call, a question during one could be the other's: it goes to none)
        self._overlapped: set[int] = set()

    def __len__(self) -> int:
        return len(self._calls)

    def start(self, events: CallEvents | None) -> int:
        """Note a call starting (its caller's stream ``events``); return its token."""
        self._started += 1
        token = self._started
        if self._calls:  # they overlap: over stdio no question can be placed in either
            self._overlapped.update(self._calls)
            self._overlapped.add(token)
        self._calls[token] = events
        return token

    def end(self, token: int) -> None:
        """Note the call ``token`` ended."""
        del self._calls[token]
        self._overlapped.discard(token)

    def _owner(self, kind: str, request_id: Any) -> int:
        """The call a server request belongs to; raise :class:`CannotAsk` saying why none
        can be told (see the module docstring)."""
        if self.relations is not None:  # streamable HTTP: the stream it came on says
            token = self.relations.call_of_request(request_id)
            if token is None:
                raise CannotAsk(f"the {kind} request of {self.tool_id} came on no call's "
                                "stream; capd relays one only to the client whose call made it")
            if token not in self._calls:
                raise CannotAsk(f"the call the {kind} request of {self.tool_id} belongs to "
                                "has ended; capd relays it to no other client")
            return token
        if not self._calls:
            raise CannotAsk(f"capd relays a {kind} request only to the client whose call "
                            f"made it, and no call to {self.tool_id} is in flight")
        if len(self._calls) > 1:
            raise CannotAsk(f"{len(self._calls)} calls to {self.tool_id} are in flight and "
                            f"the {kind} request names none of them; capd sends it to none")
        token = next(iter(self._calls))
        if token in self._overlapped:
            raise CannotAsk(f"another call to {self.tool_id} ran beside this one, and a {kind} "
                            "request over stdio names none: it could be the other's, so capd "
                            "sends it to none")
        return token

    def caller_of_request(self, kind: str, request_id: Any = None) -> CallEvents:
        """The stream of the call the request belongs to, if its caller can answer
        ``kind``; raise :class:`CannotAsk` (saying why) otherwise."""
        events = self._calls[self._owner(kind, request_id)]
        if events is None:
            raise CannotAsk(f"the client of this call to {self.tool_id} opened no stream "
                            f"(Accept: application/x-ndjson), so it cannot answer {kind}")
        if kind not in events.answers:
            raise CannotAsk(f"the client of this call to {self.tool_id} cannot answer {kind}")
        return events

    def caller_of_log(self, params: Any) -> CallEvents | None:
        """The stream of the call a log line belongs to; None when it cannot be placed."""
        if self.relations is not None:
            token = self.relations.call_of_log(params)
        elif len(self._calls) == 1 and not self._overlapped:
            token = next(iter(self._calls))
        else:
            token = None
        return self._calls.get(token) if token is not None else None


def _log_key(params: Any) -> bytes:
    if isinstance(params, dict):
        params = {k: params.get(k) for k in ("level", "logger", "data")}
    elif params is not None:
        params = {k: getattr(params, k, None) for k in ("level", "logger", "data")}
        params["level"] = str(params["level"]) if params["level"] is not None else None
    return orjson.dumps(params, option=orjson.OPT_SORT_KEYS, default=str)


