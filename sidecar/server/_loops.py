"""Loop detection per agent session: repeat, no progress, frequency.

An agent stuck in a loop calls the same thing again and again. Three patterns,
each counted per session (the ``Capd-Session`` header; ``capd mcp`` sends one
per client connection; a caller that sends none is counted by its peer, uid and
pid, so dropping the header escapes nothing) within a sliding window:

- *repeat*: the same capability with the same parameters;
- *no progress*: the same capability answering an identical result in a row
  (whatever the parameters: paging that never advances);
- *frequency*: calls to one capability in the last minute.

Only callers acting as agents are counted by default (``applies_to = "agents"``): a
caller whose grant is an agent's (a ``[[peers]]``-bound or unbound non-operator uid, a
bearer token, a narrowed bridge, an engine) or that names an agent session
(``Capd-Session``). The operator's own programs (a service polling a status, a batch
of concurrent calls) are not agents and are never refused as loops;
``applies_to = "everyone"`` counts them too.

Below ``warn_at`` a call is allowed; from ``warn_at`` it carries a warning; from
``block_at`` it is refused. Every call is counted, refused ones too, so an
agent that keeps hammering stays refused until the window has passed (or an
operator resets its session). State is bounded whatever the call rate: at most
``max_sessions`` sessions (the one idle longest is forgotten first), each
holding the times of at most 256 distinct calls (each up to ``block_at`` + 1
times within the window, 64 at least and 1,024 at most: a ``block_at`` above
that is never reached) and per-second counts of the last minute: frequency is
counted by the second.
"""

from __future__ import annotations

import collections
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Decision = Literal["allow", "warn", "block"]
Pattern = Literal["repeat", "no_progress", "frequency"]


@dataclass(frozen=True, slots=True)
class LoopPolicy:
    """Thresholds, from ``[policy.loops]`` in capd.toml."""

    enabled: bool = True
    warn_at: int = 3
    block_at: int = 5
    window_s: float = 60.0
    per_minute_warn: int = 60
    per_minute_block: int = 120
    anonymous: bool = False  # also in-process callers that send no session
    require_session: bool = False  # refuse a socket peer's call without Capd-Session
    applies_to: Literal["agents", "everyone"] = "agents"  # whose calls are counted
    max_sessions: int = 10_000


@dataclass(frozen=True, slots=True)
class LoopVerdict:
    """What the detector says of one call."""

    decision: Decision
    pattern: Pattern | None = None
    message: str | None = None


ALLOW = LoopVerdict("allow")


def fingerprint(value: Any) -> bytes:
    """A short, stable key for a JSON-able value (keys sorted): the value itself when short."""
    try:
        raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        raw = repr(value).encode()
    # A short one is copied: orjson's own bytes object can hold on to a 4 KiB buffer.
    return bytes(memoryview(raw)) if len(raw) <= 32 else hashlib.blake2b(
        raw, digest_size=16).digest()


MAX_TIMES_PER_CALL = 1024  # times kept per (capability, parameters): a repeat count stops there
MAX_CALLS_PER_SESSION = 256  # distinct (capability, parameters) kept per session


class _Seconds:
    """Calls counted by the second over a sliding span: at most ``span_s`` buckets."""

    __slots__ = ("buckets", "span_s", "total")

    def __init__(self, span_s: float) -> None:
        self.buckets: collections.deque[list[int]] = collections.deque()  # [second, calls]
        self.span_s = span_s
        self.total = 0

    def count(self, now: float, add: int = 0) -> int:
        """Calls in the span ending ``now`` (after adding ``add`` at ``now``)."""
        second = int(now)
        buckets = self.buckets
        oldest = second - self.span_s  # a bucket this old or older has left the span
        while buckets and buckets[0][0] <= oldest:
            self.total -= buckets.popleft()[1]
        if add:
            if buckets and buckets[-1][0] == second:
                buckets[-1][1] += add
            else:
                buckets.append([second, add])
            self.total += add
        return self.total


@dataclass
class _Session:
    """One session's counts, bounded whatever the call rate: the times of each repeated
    call (at most MAX_TIMES_PER_CALL, for at most MAX_CALLS_PER_SESSION distinct calls,
    least recently called forgotten first) and per-second counts for the rest."""

    # (capability, params fingerprint) -> its call times within window_s, oldest first
    repeats: collections.OrderedDict[tuple[str, bytes], collections.deque[float]] = field(
        default_factory=collections.OrderedDict)
    # capability -> its calls in the last minute, by the second
    per_cap: dict[str, _Seconds] = field(default_factory=dict)
    # every call, by the second: in the window, and in the last minute (for the listing)
    in_window: _Seconds = field(default_factory=lambda: _Seconds(60.0))
    in_minute: _Seconds = field(default_factory=lambda: _Seconds(60.0))
    # capability -> (result fingerprint, identical answers in a row, time of the last)
    streaks: dict[str, tuple[bytes, int, float]] = field(default_factory=dict)
    last_call: float = 0.0


class LoopDetector:
    """Counts calls per session and says allow, warn or block."""

    def __init__(self, policy: LoopPolicy, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._sessions: collections.OrderedDict[str, _Session] = collections.OrderedDict()

    def checks(self, session: str | None, agent: bool = True) -> bool:
        """Whether calls of ``session`` (made by an agent, or not) are loop-checked at all."""
        p = self.policy
        if not p.enabled:
            return False
        if session is None:
            return p.anonymous
        return agent or p.applies_to == "everyone"

    def before(self, session: str | None, capability: str, params: Any) -> LoopVerdict:
        """Count a call about to run; the verdict for it."""
        if not self.checks(session):
            return ALLOW
        p = self.policy
        key = session or "(anonymous)"
        now = self._clock()
        state = self._session(key, now)
        window = p.window_s
        repeats = state.repeats
        # forget the calls whose last time left the window (least recently called first)
        while repeats:
            first = next(iter(repeats.values()))
            if now - first[-1] <= window and len(repeats) < MAX_CALLS_PER_SESSION:
                break
            repeats.popitem(last=False)
        call_key = (capability, fingerprint(params))
        times = repeats.get(call_key)
        if times is None:
            times = repeats[call_key] = collections.deque(
                maxlen=min(MAX_TIMES_PER_CALL, max(64, p.block_at + 1)))
        else:
            repeats.move_to_end(call_key)
            while times and now - times[0] > window:
                times.popleft()
        times.append(now)
        same = len(times)
        counter = state.per_cap.get(capability)
        if counter is None:
            counter = state.per_cap[capability] = _Seconds(60.0)
        minute = counter.count(now, 1)
        state.in_window.count(now, 1)
        state.in_minute.count(now, 1)
        state.last_call = now
        if same < p.warn_at and minute <= p.per_minute_warn:
            previous = state.streaks.get(capability)  # the common case: nothing to say
            if previous is None or previous[1] + 1 < p.block_at:
                return ALLOW
        previous = state.streaks.get(capability)
        streak = 0 if previous is None or now - previous[2] > window else previous[1]
        span = f"{window:g} s"
        if same >= p.block_at:
            return LoopVerdict("block", "repeat", (
                f"{capability} was called {same} times with the same parameters within "
                f"{span} in session {key}: this is a loop. Do not call it again with these "
                "parameters; change them, use another capability, or ask the user."))
        if streak + 1 >= p.block_at:
            return LoopVerdict("block", "no_progress", (
                f"{capability} answered the same result {streak} times in a row in session "
                f"{key}: calling it again will not make progress. Change approach or ask "
                "the user."))
        if minute > p.per_minute_block:
            return LoopVerdict("block", "frequency", (
                f"{capability} was called {minute} times in the last minute in session {key} "
                f"(limit {p.per_minute_block}): slow down or change approach."))
        if same >= p.warn_at:
            return LoopVerdict("warn", "repeat", (
                f"{capability} called {same} times with the same parameters within {span}; "
                f"call {p.block_at} will be refused as a loop"))
        if minute > p.per_minute_warn:
            return LoopVerdict("warn", "frequency", (
                f"{capability} called {minute} times in the last minute; over "
                f"{p.per_minute_block} will be refused"))
        return ALLOW

    def after(self, session: str | None, capability: str, result: Any) -> LoopVerdict:
        """Record a call's answer; a warning when it repeats the previous ones."""
        if not self.checks(session):
            return ALLOW
        key = session or "(anonymous)"
        now = self._clock()
        state = self._session(key, now)
        digest = fingerprint(result)
        previous = state.streaks.get(capability)
        count = 1
        if previous is not None and previous[0] == digest \
                and now - previous[2] <= self.policy.window_s:
            count = previous[1] + 1
        state.streaks[capability] = (digest, count, now)
        if count >= self.policy.warn_at:
            return LoopVerdict("warn", "no_progress", (
                f"{capability} answered the same result {count} times in a row; after "
                f"{self.policy.block_at - 1} the next call is refused as a loop"))
        return ALLOW

    def reset(self, session: str) -> bool:
        """Forget a session's counts (an operator's action); whether it was known."""
        return self._sessions.pop(session, None) is not None

    def sessions(self) -> list[dict[str, Any]]:
        """The sessions being tracked, the one active last first (calls counted by the
        second)."""
        now = self._clock()
        return [{"session": name, "calls_in_window": state.in_window.count(now),
                 "calls_last_minute": state.in_minute.count(now),
                 "last_call_age_s": round(now - state.last_call, 3)}
                for name, state in reversed(self._sessions.items())]

    def _session(self, key: str, now: float) -> _Session:
        """``key``'s state, made the most recently used; sessions idle past every window
        (nothing of theirs can count again) are forgotten, least recently used first."""
        sessions = self._sessions
        state = sessions.get(key)
        if state is None:
            state = sessions[key] = _Session(in_window=_Seconds(self.policy.window_s))
            while len(sessions) > self.policy.max_sessions:
                sessions.popitem(last=False)
        else:
            sessions.move_to_end(key)
        idle_after = max(self.policy.window_s, 60.0)  # the minute counts and the window
        while sessions:
            oldest_key, oldest = next(iter(sessions.items()))
            if oldest is state or now - oldest.last_call <= idle_after:
                break
            del sessions[oldest_key]
        return state
