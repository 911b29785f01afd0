"""Streamed calls: progress, logs and the server's questions on the way to the answer.

A ``POST /call/{name}`` sent with ``Accept: application/x-ndjson`` runs with a
:class:`CallStream` as its :data:`~capd.registry.CALL_EVENTS`. A call that says
nothing before it answers is answered exactly as without the header (JSON, the
usual status). Once it has something to say, the answer becomes ``200`` with
``Content-Type: application/x-ndjson``, one JSON object a line::

    {"event": "progress", "progress": 1, "total": 3, "message": "copying"}
    {"event": "log", "level": "info", "logger": "fs", "data": "..."}
    {"event": "request", "id": "1", "method": "sampling/createMessage",
     "params": {...}, "answer": "/calls/<call>/answers/1"}
    {"event": "result", "http_status": 200, "tool_result": {... the ToolResult ...}}

The last line is always ``result``, with the status the call would have answered.
A ``request`` line is a question a server asks during the call (MCP sampling or
elicitation), sent only to a caller that said it can answer that kind
(``Capd-Answers: sampling, elicitation``); the caller answers it on another
connection with ``POST /calls/<call>/answers/<id>`` and ``{"result": {...}}`` or
``{"error": {"code": -1, "message": "..."}}``, from the same uid and grant. A
question that is not answered within the call's time is refused to the server.

A client that closes the stream cancels the call: the upstream request is
cancelled (the SDK sends ``notifications/cancelled``) and nothing is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from capd.registry import CannotAsk

from ._grant import Caller

NDJSON = "application/x-ndjson"
MAX_QUEUED_LINES = 1024
"""Progress and log lines kept while the client reads slowly (the oldest progress goes)."""
ANSWER_KINDS = frozenset({"sampling", "elicitation"})


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` unless it is done, and wait for it (its cancellation reaches the server)."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


def wants_stream(headers: Any) -> bool:
    """Whether the request asked for a streamed answer (``Accept: application/x-ndjson``)."""
    return NDJSON in headers.get("accept", "")


def answer_kinds(headers: Any) -> frozenset[str]:
    """The kinds of question the caller can answer (``Capd-Answers``), unknown ones left out."""
    said = headers.get("capd-answers", "")
    return frozenset(k.strip().lower() for k in said.split(",")) & ANSWER_KINDS


class CallStream:
    """One streamed call: the events on their way out and the questions awaiting answers."""

    def __init__(self, call_id: str, caller: Caller, answers: frozenset[str],
                 forget: Callable[[str], None]) -> None:
        self.call_id = call_id
        self.caller = caller
        self._answers = answers
        self._forget = forget
        self._lines: deque[bytes] = deque()
        self._ready = asyncio.Event()
        self._questions: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._asked = 0
        self.open = True
        self._task: asyncio.Task[Any]  # the call, and its answer's line: see body()
        self._last_line: Callable[[Any], bytes]

    # -- the call's side (registry.CallEvents) ------------------------------------------

    @property
    def answers(self) -> frozenset[str]:
        return self._answers if self.open else frozenset()

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        self._put({"event": "progress", "progress": progress, "total": total,
                   "message": message})

    def log(self, level: str, logger: str | None, data: Any) -> None:
        self._put({"event": "log", "level": level, "logger": logger, "data": data})

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if not self.open:
            raise CannotAsk("the client of this call has gone")
        self._asked += 1
        question = str(self._asked)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._questions[question] = future
        self._put({"event": "request", "id": question, "method": method, "params": params,
                   "answer": f"/calls/{self.call_id}/answers/{question}"}, keep=True)
        try:
            return await future
        finally:
            self._questions.pop(question, None)

    def _put(self, event: dict[str, Any], *, keep: bool = False) -> None:
        if not self.open:
            return
        if len(self._lines) >= MAX_QUEUED_LINES and not keep:
            return  # a client that reads this slowly loses progress, never a question
        self._lines.append(orjson.dumps(event, default=str) + b"\n")
        self._ready.set()

    # -- the client's side -------------------------------------------------------------

    def answer(self, question: str, body: Any) -> None:
        """Settle ``question`` with the client's ``{"result": ...}`` or ``{"error": ...}``;
        raise ``KeyError`` when no such question waits, ``TypeError`` for another body."""
        future = self._questions[question]
        if future.done():
            raise KeyError(question)
        if isinstance(body, dict) and isinstance(body.get("result"), dict):
            future.set_result(body["result"])
        elif isinstance(body, dict) and isinstance(body.get("error"), dict):
            error = body["error"]
            future.set_exception(CannotAsk(
                f"the client declined: {error.get('message', 'no reason given')}"))
        else:
            raise TypeError('send {"result": {...}} or {"error": {"code": N, "message": "..."}}')

    async def said_something(self, task: asyncio.Task[Any],
                             gone: asyncio.Event | None) -> bool:
        """Wait until the call has an event to stream (True) or is done (False); raise
        ``ConnectionResetError`` when the client leaves first (the call is cancelled)."""
        if self._lines:
            return True
        await self._until_something(task, gone)
        if gone is not None and gone.is_set() and not task.done():
            await _cancel(task)
            raise ConnectionResetError("the client left before the call answered")
        return bool(self._lines)

    def body(self, task: asyncio.Task[Any], last_line: Callable[[Any], bytes]) -> CallStream:
        """This stream as the HTTP body (``_http.StreamBody``) that streams the call
        until ``task`` ends, with ``last_line`` of its result last."""
        self._task, self._last_line = task, last_line
        return self

    async def run(self, send: Callable[[bytes], Awaitable[None]], gone: asyncio.Event) -> None:
        """Send events as they come; the result last. A client that leaves cancels the
        call (and it is waited for, so its cancellation reaches the server)."""
        task = self._task
        try:
            await self._pump(task, send, gone)
            await send(self._last_line(task.result()) + b"\n")
        except BaseException:
            await _cancel(task)
            raise
        finally:
            self.close()

    async def _pump(self, task: asyncio.Task[Any], send: Callable[[bytes], Awaitable[None]],
                    gone: asyncio.Event) -> None:
        """Send the events until the call is done; raise when the client is gone first."""
        while True:
            while self._lines:
                await send(self._lines.popleft())
            if task.done():
                return
            await self._until_something(task, gone)
            if gone.is_set():
                raise ConnectionResetError("the client closed the stream")

    async def _until_something(self, task: asyncio.Task[Any],
                               gone: asyncio.Event | None) -> None:
        """Wait until the call has a line to send, ends, or its client leaves."""
        self._ready.clear()
        if self._lines:  # put before the clear: already here
            return
        waiters = [asyncio.ensure_future(self._ready.wait())]
        if gone is not None:
            waiters.append(asyncio.ensure_future(gone.wait()))
        try:
            await asyncio.wait([task, *waiters], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def close(self) -> None:
        """No more events; questions still waiting are refused to the server."""
        if not self.open:
            return
        self.open = False
        for future in self._questions.values():
            if not future.done():
                future.set_exception(CannotAsk("the client of this call has gone"))
        self._forget(self.call_id)


class Streams:
    """The streamed calls running now, by call id (what an answer names)."""

    def __init__(self) -> None:
        self._open: dict[str, CallStream] = {}

    def open(self, caller: Caller, answers: frozenset[str]) -> CallStream:
        """A new stream for a call of ``caller``."""
        call_id = secrets.token_urlsafe(12)
        stream = CallStream(call_id, caller, answers, self._forget)
        self._open[call_id] = stream
        return stream

    def _forget(self, call_id: str) -> None:
        self._open.pop(call_id, None)

    def of(self, call_id: str, caller: Caller) -> CallStream | None:
        """The stream ``call_id`` if ``caller`` may answer its questions (the same uid and
        grant as the call's caller); None otherwise, as for one that does not exist."""
        stream = self._open.get(call_id)
        if stream is None or stream.caller.uid != caller.uid or \
                stream.caller.grant.tag != caller.grant.tag:
            return None
        return stream
