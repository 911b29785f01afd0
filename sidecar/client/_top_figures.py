"""``capd top``'s values and figures: what one refresh read (:class:`Sample`), and the
rates, quantiles and refusals made from two samples (the daemon's counters are totals since
it started: a series that went down, the daemon restarted, counts from zero)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

WINDOW_S = 60.0  # counts, quantiles and refusals are over this much of the recent past
REFUSAL = "block"  # the policy decision that refuses a call (capd_policy_decisions_total)
K = TypeVar("K")


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Counters:
    """The figures of ``/metrics`` the view uses, each a total since the daemon started."""

    calls: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (capability, status)
    buckets: Mapping[tuple[str, float], float] = field(default_factory=dict)  # (capability, le)
    decisions: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (kind, decision)


@dataclass(frozen=True)
class Disabled:
    """A disabled capability: the tools it misses, each one's error, since when (epoch)."""

    name: str
    missing: tuple[str, ...]
    errors: Mapping[str, str]
    since: float | None


@dataclass(frozen=True)
class Tool:
    """A tool's last probe (an upstream MCP server is a tool; its probe is a ping)."""

    name: str
    ok: bool
    latency_s: float | None
    checked_at: float | None
    error: str | None
    upstream: Mapping[str, Any] | None = None  # an MCP server's session (``/status``)


@dataclass(frozen=True)
class Job:
    """The oldest pending job of the retry queue."""

    id: str
    capability: str
    created_at: float | None
    attempts: int
    max_attempts: int
    last_error: str | None


@dataclass(frozen=True)
class QueueFigures:
    """The retry queue: jobs by state, the oldest pending one's age, and that job when the
    daemon lists it."""

    by_state: Mapping[str, int] = field(default_factory=dict)
    oldest_pending_age_s: float | None = None
    oldest_job: Job | None = None


@dataclass(frozen=True)
class Sample:
    """One refresh: what the daemon said. ``problems`` names each section the daemon
    would not give, and why."""

    taken_at: float  # the loop's clock (monotonic) at the refresh
    pid: int | None = None
    state: str = "?"
    version: str = "?"
    uptime_s: float = 0.0
    counts: Mapping[str, int] = field(default_factory=dict)  # live, disabled, errors
    in_flight: int = 0
    disabled: tuple[Disabled, ...] = ()
    tools: tuple[Tool, ...] = ()
    queue: QueueFigures = field(default_factory=QueueFigures)
    counters: Counters | None = None
    refusals: tuple[Refusal, ...] = ()  # the latest, newest first
    problems: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """One recent policy decision that was not a plain allow, as ``/status`` keeps it."""

    at: float | None
    kind: str
    decision: str
    capability: str
    reason: str


@dataclass(frozen=True)
class Away:
    """The daemon cannot be read: since when (epoch), the headline and why."""

    since: float
    headline: str
    reason: str


@dataclass(frozen=True)
class View:
    """What one drawing shows: recent samples (oldest first), or why there are none."""

    socket_path: Path
    now: float  # epoch, for the times the daemon gives
    samples: Sequence[Sample] = ()
    away: Away | None = None


@dataclass(frozen=True)
class CallFigures:
    """One capability's calls: per second over the last refresh, the rest over the window."""

    capability: str
    per_s: float | None
    calls: float
    errors: float
    p50_s: float | None
    p99_s: float | None


# ---------------------------------------------------------------------------- figures


def parse_metrics(text: str) -> Counters:
    """The counters in a Prometheus text exposition; raise ValueError if it is not one."""
    calls: dict[tuple[str, str], float] = {}
    buckets: dict[tuple[str, float], float] = {}
    decisions: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "capd_calls_total":
                calls[s.labels.get("capability", ""), s.labels.get("status", "")] = s.value
            elif s.name == "capd_call_duration_seconds_bucket":
                buckets[s.labels.get("capability", ""), float(s.labels["le"])] = s.value
            elif s.name == "capd_policy_decisions_total":
                decisions[s.labels.get("kind", ""), s.labels.get("decision", "")] = s.value
    return Counters(calls, buckets, decisions)


def delta(old: Mapping[K, float], new: Mapping[K, float]) -> dict[K, float]:
    """``new - old`` per series; a series that went down started again from zero (the daemon
    restarted), so all of it counts."""
    return {key: value - old.get(key, 0.0) if value >= old.get(key, 0.0) else value
            for key, value in new.items()}


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q``-quantile of a histogram given as (upper bound, cumulative count), estimated
    as Prometheus's ``histogram_quantile`` does: linearly within the bucket it falls in, the
    largest finite bound when it falls in ``+Inf``. None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            share = (rank - lower_count) / (count - lower_count)
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def _by(changes: Mapping[tuple[str, str], float],
        keep: Callable[[str], bool] = lambda _second: True) -> dict[str, float]:
    """Sum ``changes`` by the first label over the series whose second label ``keep`` takes."""
    out: dict[str, float] = {}
    for (first, second), n in changes.items():
        if keep(second) and n:
            out[first] = out.get(first, 0.0) + n
    return out


def _window(samples: Sequence[Sample]) -> tuple[Counters, Counters] | None:
    """The counters at the start of the window (with one sample: the daemon's start, zero)
    and the latest; None before any sample has counters."""
    counted = [s.counters for s in samples if s.counters is not None]
    if not counted:
        return None
    return (counted[0] if len(counted) > 1 else Counters()), counted[-1]


def _last_step(samples: Sequence[Sample]) -> tuple[dict[tuple[str, str], float], float] | None:
    """The calls counted between the last two samples with counters, and the seconds
    between them; None before there are two."""
    timed = [(s.taken_at, s.counters) for s in samples if s.counters is not None]
    if len(timed) < 2 or timed[-1][0] <= timed[-2][0]:
        return None
    (old_at, old), (new_at, new) = timed[-2], timed[-1]
    return delta(old.calls, new.calls), new_at - old_at


def overall_rate(samples: Sequence[Sample]) -> float | None:
    """Calls per second over the last refresh; None before two samples."""
    step = _last_step(samples)
    return None if step is None else sum(step[0].values()) / step[1]


def call_figures(samples: Sequence[Sample]) -> list[CallFigures]:
    """Each capability called since the daemon started, busiest in the window first."""
    window = _window(samples)
    if window is None:
        return []
    base, last = window
    moved = delta(base.calls, last.calls)
    calls, errors = _by(moved), _by(moved, lambda status: status != "success")
    latency = delta(base.buckets, last.buckets)
    step = _last_step(samples)
    rates = None if step is None else {name: n / step[1] for name, n in _by(step[0]).items()}
    names = {c for c, _ in last.calls} | {c for c, _ in last.buckets}
    rows = [CallFigures(name, None if rates is None else rates.get(name, 0.0),
                        calls.get(name, 0.0), errors.get(name, 0.0),
                        *_quantiles(name, latency)) for name in names]
    return sorted(rows, key=lambda r: (-r.calls, r.capability))


def _quantiles(name: str, latency: Mapping[tuple[str, float], float]
               ) -> tuple[float | None, float | None]:
    series = [(le, n) for (capability, le), n in latency.items() if capability == name]
    return quantile(0.5, series), quantile(0.99, series)


def refusal_figures(samples: Sequence[Sample]) -> tuple[dict[str, float], dict[str, float]]:
    """Over the window: policy refusals by step (consent, loop, hook...), and calls answered
    ``error_blocked`` by capability."""
    window = _window(samples)
    if window is None:
        return {}, {}
    base, last = window
    return (_by(delta(base.decisions, last.decisions), lambda d: d == REFUSAL),
            _by(delta(base.calls, last.calls), lambda s: s == "error_blocked"))


# ------------------------------------------------------------------------- formatting
