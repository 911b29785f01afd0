"""``capd top``: a live view of the daemon in the terminal, read again every few seconds.

Three layers, so that every figure can be tested without a terminal:

- **read** (:func:`read_sample`): one refresh is a :class:`Sample`, read from the operator
  rows through the CLI's socket client: ``GET /status`` (state, counts, each tool's last
  probe), ``/capabilities?state=disabled`` and each one's ``/capabilities/{name}`` (what it
  misses, since when), ``/metrics`` (call counters, the latency histogram, policy
  decisions), ``/queue/stats`` and ``/queue/{id}`` (the oldest pending job);
- **figures** (``_top_figures``: :func:`parse_metrics`, :func:`delta`, :func:`quantile`,
  :func:`call_figures`, :func:`refusal_figures`): the daemon's counters are totals since it
  started, so rates, quantiles and refusals are differences between two samples: calls
  per second over the last refresh; counts, p50/p99 and refusals over the last
  :data:`WINDOW_S`. A series that went down (the daemon restarted) counts from zero;
- **draw** (:func:`render` gives the lines, :func:`_draw` puts them in the window): every
  value the daemon sent goes through ``one_line``, so a name cannot steer the terminal;
  what does not fit the window is cut, so a small or resized terminal shows what fits.

A daemon that does not answer is a state of the view, not an error: each refresh tries
again, and the view says since when it has not answered. ``q`` quits (exit 0), Ctrl-C
stops quietly (exit 130).
"""

from __future__ import annotations

import contextlib
import curses
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlencode

from .._errors import DaemonUnreachable
from ._completion import RowFailed as _RowFailed
from ._completion import getter
from ._terminal import one_line as _text  # a value the daemon sent, for one line
from ._top_figures import (  # the values and figures, apart
    REFUSAL,
    WINDOW_S,
    Away,
    Counters,
    Disabled,
    Job,
    QueueFigures,
    Refusal,
    Sample,
    Tool,
    View,
    call_figures,
    overall_rate,
    parse_metrics,
    refusal_figures,
)

EXIT_OK = 0
EXIT_INTERRUPTED = 130  # as cli.EXIT_INTERRUPTED; cli imports this module, so not from there

REQUEST_TIMEOUT_S = 2.0  # a daemon that takes longer is shown as not answering
MAX_DISABLED = 20  # disabled capabilities read in full each refresh (one request each)
NAME_WIDTH = 32

Style = Literal["title", "head", "warn", "plain"]
Line = tuple[str, Style]
Getter = Callable[[str], Any]
K = TypeVar("K")
T = TypeVar("T")


RECENT_SHOWN = 5
"""How many of the daemon's recent policy decisions the view lists."""


def format_seconds(seconds: float | None) -> str:
    """A latency: ``0.4 ms``, ``12.0 ms``, ``2.50 s``; ``-`` for none."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def format_age(seconds: float | None) -> str:
    """A span as a person reads it: ``42s``, ``3m05s``, ``2h10m``, ``3d04h``."""
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    for size, unit, part, part_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"),
                                        (60, "m", 1, "s")):
        if s >= size:
            return f"{s // size}{unit}{s % size // part:02d}{part_unit}"
    return f"{s}s"


def format_clock(epoch: float) -> str:
    """``HH:MM:SS`` in local time."""
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def _counts(items: Iterable[tuple[str, float]]) -> str:
    return ", ".join(f"{_text(k)} {n:g}" for k, n in sorted(items)) or "none"


def _title(view: View, s: Sample | None) -> Line:
    where = _text(view.socket_path)
    if s is None:
        return f"capd top  {where}  {format_clock(view.now)}  q quits", "title"
    return (f"capd {_text(s.version)}  {_text(s.state)}  pid {s.pid}  up {format_age(s.uptime_s)}"
            f"  {where}  {format_clock(view.now)}  q quits", "title")


def _capability_lines(s: Sample, now: float) -> list[Line]:
    c = s.counts
    lines: list[Line] = [(f"Capabilities  {c.get('live', 0)} live  {c.get('disabled', 0)} "
                          f"disabled  {c.get('errors', 0)} declaration errors", "head")]
    if "capabilities" in s.problems:
        return [*lines, (f"  {_text(s.problems['capabilities'])}", "warn")]
    for d in s.disabled:
        since = (f"down since {format_clock(d.since)} ({format_age(now - d.since)} ago)"
                 if d.since is not None else "down")
        missing = "; ".join(f"{_text(t)}: {_text(d.errors[t])}" if t in d.errors else _text(t)
                            for t in d.missing)
        lines.append((f"  {_text(d.name):<{NAME_WIDTH}} {since}  missing {missing}", "warn"))
    hidden = c.get("disabled", 0) - len(s.disabled)
    if hidden > 0:
        lines.append((f"  ... and {hidden} more (capd list --state disabled)", "plain"))
    return lines


def _tool_lines(s: Sample, now: float) -> list[Line]:
    down = sum(not t.ok for t in s.tools)
    lines: list[Line] = [(f"Tools and upstream MCP servers  {len(s.tools) - down} up  "
                          f"{down} down", "head")]
    for t in s.tools:
        probed = (f"probed {format_age(now - t.checked_at)} ago"
                  if t.checked_at is not None else "not probed")
        text = (f"  {_text(t.name):<{NAME_WIDTH}} {'up' if t.ok else 'DOWN':<5}"
                f"{format_seconds(t.latency_s):>10}  {probed}")
        if t.error:
            text += f"  {_text(t.error)}"
        lines.append((text, "plain" if t.ok else "warn"))
        if t.upstream is not None:
            lines.append(_upstream_line(t.upstream, now))
    return lines


def _upstream_line(u: Mapping[str, Any], now: float) -> Line:
    """An MCP server's session under its tool: connected or lost, since when, what it is."""
    since = _float(u.get("since"))
    when = f" since {format_age(now - since)} ago" if since is not None else ""
    server = u.get("server") if isinstance(u.get("server"), dict) else None
    named = (f" {_text(server.get('name'))} {_text(server.get('version'))}"
             if server else "")
    if u.get("connected"):
        return (f"    mcp {_text(u.get('kind'))}: connected{when}{named}, "
                f"{u.get('tools', 0)} tools, {u.get('in_flight', 0)} calls in flight", "plain")
    error = f": {_text(u['last_error'])}" if u.get("last_error") else ""
    return (f"    mcp {_text(u.get('kind'))}: NOT CONNECTED{when}{error}", "warn")


_CALL_HEADER = ("CAPABILITY", "CALLS/S", "CALLS", "ERRORS", "P50", "P99")


def _window_label(samples: Sequence[Sample]) -> str:
    span = samples[-1].taken_at - samples[0].taken_at if len(samples) > 1 else 0.0
    return f"the last {span:.0f} s" if span > 0 else "the daemon's life (one sample yet)"


def _call_lines(samples: Sequence[Sample]) -> list[Line]:
    s = samples[-1]
    rate = overall_rate(samples)
    head = (f"Calls  {'-' if rate is None else f'{rate:.1f}'}/s  in flight {s.in_flight}"
            f"  (counts and p50/p99 over {_window_label(samples)})")
    lines: list[Line] = [(head, "head")]
    if "metrics" in s.problems:
        return [*lines, (f"  {_text(s.problems['metrics'])}", "warn")]
    rows = [(_text(r.capability), "-" if r.per_s is None else f"{r.per_s:.1f}",
             f"{r.calls:g}", f"{r.errors:g}", format_seconds(r.p50_s), format_seconds(r.p99_s))
            for r in call_figures(samples)]
    return lines + [(f"  {n:<{NAME_WIDTH}} {s:>8} {c:>7} {e:>7} {p50:>10} {p99:>10}", "plain")
                    for n, s, c, e, p50, p99 in ([_CALL_HEADER, *rows] if rows else [])]


def _queue_lines(s: Sample, now: float) -> list[Line]:
    if "queue" in s.problems:
        return [("Queue", "head"), (f"  {_text(s.problems['queue'])}", "warn")]
    q = s.queue
    states = "  ".join(f"{_text(k)} {v}" for k, v in q.by_state.items())
    stuck = q.by_state.get("needs_operator", 0) + q.by_state.get("dead", 0)
    lines: list[Line] = [(f"Queue  {states}", "warn" if stuck else "head")]
    age, job = q.oldest_pending_age_s, q.oldest_job
    if job is not None:
        waited = age if age is not None else (now - job.created_at if job.created_at else None)
        text = (f"  oldest pending: {format_age(waited)} old, job {_text(job.id)} "
                f"{_text(job.capability)}, attempt {job.attempts}/{job.max_attempts}")
        if job.last_error:
            text += f", last error: {_text(job.last_error)}"
        lines.append((text, "plain"))
    elif age is not None:
        lines.append((f"  oldest pending: {format_age(age)} old", "plain"))
    return lines


def _refusal_lines(samples: Sequence[Sample]) -> list[Line]:
    if "metrics" in samples[-1].problems:
        return []
    steps, blocked = refusal_figures(samples)
    latest = samples[-1].counters
    ever = sum(n for (_, d), n in latest.decisions.items() if d == REFUSAL) if latest else 0
    head = (f"Refusals over {_window_label(samples)}  {sum(steps.values()):g}"
            f"  (since the daemon started: {ever:g})")
    lines: list[Line] = [(head, "warn" if steps or blocked else "head"),
                         (f"  policy refusals by step: {_counts(steps.items())}", "plain"),
                         (f"  calls answered error_blocked: {_counts(blocked.items())}", "plain")]
    for refusal in samples[-1].refusals:
        when = format_clock(refusal.at) if refusal.at else "?"
        lines.append((f"  {when}  {_text(refusal.kind)} {_text(refusal.decision)}  "
                      f"{_text(refusal.capability)}: {_text(refusal.reason)}",
                      "warn" if refusal.decision == REFUSAL else "plain"))
    return lines


def render(view: View) -> list[Line]:
    """The lines of one drawing, top to bottom (what matters most first: a short terminal
    shows the top). Every value from the daemon is escaped; lines are not cut to a width."""
    if view.away is not None:
        return [_title(view, None), (view.away.headline, "warn"),
                (f"  {_text(view.away.reason)}", "plain")]
    if not view.samples:
        return [_title(view, None), ("reading the daemon...", "plain")]
    s = view.samples[-1]
    sections = (_capability_lines(s, view.now), _tool_lines(s, view.now),
                _call_lines(view.samples), _queue_lines(s, view.now),
                _refusal_lines(view.samples))
    lines = [_title(view, s)]
    for section in sections:
        lines += [("", "plain"), *section]
    return lines


# ------------------------------------------------------------------------------- read


def _object(body: Any, path: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _RowFailed(f"GET {path} did not answer a JSON object")
    return body


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _read_disabled(get: Getter) -> tuple[Disabled, ...]:
    query = urlencode({"state": "disabled", "limit": MAX_DISABLED})
    listed = _object(get(f"/capabilities?{query}"), "/capabilities")
    out = []
    for capsule in listed.get("capabilities", []):
        name = str(capsule.get("name", ""))
        body = _object(get(f"/capabilities/{quote(name, safe='')}"), "/capabilities/{name}")
        why = body.get("disabled")
        if not why:  # restored between the list and this read
            continue
        out.append(Disabled(name, tuple(str(t) for t in why.get("missing", [])),
                            {str(k): str(v) for k, v in why.get("errors", {}).items()},
                            _float(why.get("since"))))
    return tuple(out)


def _read_tools(status: Mapping[str, Any]) -> tuple[Tool, ...]:
    probes = (status.get("registry") or {}).get("tools") or {}
    upstreams = status.get("upstreams") or {}
    return tuple(Tool(str(name), bool(p.get("ok")), _float(p.get("latency_s")),
                      _float(p.get("checked_at")), p.get("error") and str(p["error"]),
                      upstreams.get(name) if isinstance(upstreams.get(name), dict) else None)
                 for name, p in sorted(probes.items()))


def _read_oldest_job(get: Getter, oldest: Any) -> Job | None:
    """The job ``/queue/stats`` names as the oldest unfinished one, read whole (its tries
    and last error); None when there is none or it finished meanwhile."""
    if not isinstance(oldest, dict) or not oldest.get("id"):
        return None
    try:
        j = _object(get(f"/queue/{quote(str(oldest['id']), safe='')}"), "/queue/{id}")
    except _RowFailed:  # finished and purged since the stats were read
        return None
    attempts = j.get("attempts")  # the try count (an older daemon: its audit trail)
    tries = (sum(1 for a in attempts if isinstance(a, dict) and a.get("kind") == "claim")
             if isinstance(attempts, list) else int(attempts or 0))
    return Job(str(j.get("id")), str(j.get("capability")), _float(j.get("created_at")),
               tries, int(j.get("max_attempts") or 0),
               j.get("last_error") and str(j["last_error"]))


def _read_queue(get: Getter) -> QueueFigures:
    stats = _object(get("/queue/stats"), "/queue/stats")
    by_state = {str(k): int(v) for k, v in (stats.get("by_state") or {}).items()}
    return QueueFigures(by_state, _float(stats.get("oldest_pending_age_s")),
                        _read_oldest_job(get, stats.get("oldest_pending")))


def _section(problems: dict[str, str], name: str, read: Callable[[], T], empty: T) -> T:
    """``read()``, or ``empty`` with why in ``problems[name]`` when the daemon would not give
    it (a row it refuses, or a body the view cannot read). DaemonUnreachable goes through."""
    try:
        return read()
    except _RowFailed as exc:
        problems[name] = str(exc)
        return empty
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a body of another shape
        problems[name] = f"cannot read the daemon's answer ({type(exc).__name__}: {exc})"
        return empty


def read_sample(get: Getter, taken_at: float) -> Sample:
    """One refresh. Raises :class:`DaemonUnreachable` when the daemon does not answer and
    :class:`_RowFailed` when ``/status`` is refused; any other row's failure is a problem
    of its section."""
    status = _object(get("/status"), "/status")
    registry = status.get("registry") or {}
    problems: dict[str, str] = {}
    disabled: tuple[Disabled, ...] = _section(problems, "capabilities",
                                              partial(_read_disabled, get), ())
    queue = _section(problems, "queue", partial(_read_queue, get), QueueFigures())
    counters: Counters | None = _section(problems, "metrics",
                                         lambda: parse_metrics(str(get("/metrics"))), None)
    return Sample(
        taken_at=taken_at, pid=status.get("pid"), state=str(status.get("state", "?")),
        version=str(status.get("version", "?")), uptime_s=_float(status.get("uptime_s")) or 0.0,
        counts={k: int(registry.get(k) or 0) for k in ("live", "disabled")}
        | {"errors": len(registry.get("errors") or [])},
        in_flight=int((status.get("calls") or {}).get("in_flight") or 0),
        disabled=disabled, tools=_read_tools(status), queue=queue, counters=counters,
        refusals=_read_refusals(status), problems=problems)


def _read_refusals(status: Mapping[str, Any]) -> tuple[Refusal, ...]:
    recent = (status.get("policy") or {}).get("recent") or []
    return tuple(Refusal(_float(r.get("at")), str(r.get("kind", "?")),
                         str(r.get("decision", "?")), str(r.get("capability", "?")),
                         str(r.get("reason") or ""))
                 for r in reversed(recent) if isinstance(r, dict))[:RECENT_SHOWN]


class Watch:
    """What the view keeps between refreshes: the samples of the last :data:`WINDOW_S`
    (and the one before), or since when the daemon has been away."""

    def __init__(self, socket_path: Path, get: Getter) -> None:
        self.socket_path = socket_path
        self._get = get
        self.samples: deque[Sample] = deque()
        self.away: Away | None = None

    def refresh(self, taken_at: float, now: float) -> None:
        """Read the daemon once; never raises for a daemon that is down or refuses."""
        try:
            sample = read_sample(self._get, taken_at)
        except (DaemonUnreachable, _RowFailed, ValueError) as exc:
            where = _text(self.socket_path)
            self._gone(now, f"daemon not reachable at {where}" if isinstance(
                exc, DaemonUnreachable) else f"daemon at {where} answers, but not its status",
                str(exc))
            return
        self.away = None
        if self.samples and self.samples[-1].pid != sample.pid:
            self.samples.clear()  # another daemon: its counters started again
        self.samples.append(sample)
        while len(self.samples) > 2 and self.samples[1].taken_at <= taken_at - WINDOW_S:
            self.samples.popleft()

    def _gone(self, now: float, what: str, reason: str) -> None:
        since = self.away.since if self.away is not None else now
        self.away = Away(since, f"{what} (since {format_clock(since)}), retrying", reason)

    def view(self, now: float) -> View:
        """What to draw now."""
        return View(self.socket_path, now, tuple(self.samples), self.away)


# ------------------------------------------------------------------------------- draw


def _styles() -> dict[Style, int]:
    warn = curses.A_BOLD
    if curses.has_colors():
        with contextlib.suppress(curses.error):  # a terminal without colours keeps bold
            curses.start_color()
            curses.use_default_colors()
            curses.init_pair(1, curses.COLOR_RED, -1)
            warn |= curses.color_pair(1)
    return {"title": curses.A_REVERSE, "head": curses.A_BOLD, "warn": warn,
            "plain": curses.A_NORMAL}


def _draw(screen: curses.window, lines: Sequence[Line], styles: Mapping[Style, int]) -> None:
    """Put ``lines`` in the window, each cut to its width; what does not fit is left out."""
    screen.erase()
    height, width = screen.getmaxyx()
    for row, (text, style) in enumerate(lines[:height]):
        # curses cannot write the last cell of the window without an error; wide characters
        # take two cells and may still reach it: a line that does not fit is cut short.
        with contextlib.suppress(curses.error, UnicodeEncodeError):
            screen.addnstr(row, 0, text, max(0, width - 1), styles[style])
    screen.refresh()


def _loop(screen: curses.window, watch: Watch, interval_s: float,
          clock: Callable[[], float] = time.monotonic,
          wall: Callable[[], float] = time.time) -> int:
    with contextlib.suppress(curses.error):  # a terminal that cannot hide the cursor
        curses.curs_set(0)
    styles = _styles()
    due = clock()
    while True:
        if clock() >= due:
            watch.refresh(clock(), wall())
            due = clock() + interval_s
        _draw(screen, render(watch.view(wall())), styles)
        screen.timeout(max(1, math.ceil((due - clock()) * 1000)))
        key = screen.getch()  # a key, KEY_RESIZE (drawn again at the new size), or -1
        if key in (ord("q"), ord("Q")):
            return EXIT_OK


def run_top(socket_path: Path, interval: float) -> int:
    """Show the daemon at ``socket_path``, read every ``interval`` seconds, until ``q``
    (0) or Ctrl-C (130). The terminal is restored in either case."""
    watch = Watch(socket_path, getter(socket_path, REQUEST_TIMEOUT_S))
    # ncurses takes LINES and COLUMNS, when set, over the terminal's size, even after a
    # resize (GNU readline exports them in a process that loaded it): the view must follow
    # the terminal it is in.
    for name in ("LINES", "COLUMNS"):
        os.environ.pop(name, None)
    try:
        code: int = curses.wrapper(_loop, watch, interval)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return code
