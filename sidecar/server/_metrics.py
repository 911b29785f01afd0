"""Prometheus metrics, in the text format, from one registry owned by the daemon.

Most figures are read from the daemon's own state when scraped (counters it
already keeps), so the call path pays for one histogram observation only.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ._services import Services

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_Family = CounterMetricFamily | GaugeMetricFamily
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)


class LatencyHistogram(Collector):
    """Call latency by capability, as a Prometheus histogram.

    An observation is a bisect and two additions on the event loop (the client
    library's histogram takes a lock and walks its buckets: a twentieth of a no-op
    call). Bucket counts are kept per bucket and made cumulative at scrape time.
    """

    def __init__(self, name: str, documentation: str,
                 buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = buckets
        # capability -> [count in each bucket (the last is +Inf)..., sum of durations]
        self._series: dict[str, list[float]] = {}

    def observe(self, capability: str, duration_s: float) -> None:
        """Count one call of ``capability`` that took ``duration_s``."""
        series = self._series.get(capability)
        if series is None:
            series = self._series[capability] = [0.0] * (len(self._bounds) + 2)
        series[bisect_left(self._bounds, duration_s)] += 1
        series[-1] += duration_s

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=["capability"])
        for capability, series in sorted(self._series.items()):
            running, buckets = 0.0, []
            for bound, count in zip((*self._bounds, float("inf")), series, strict=False):
                running += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
            family.add_metric([capability], buckets, sum_value=series[-1])
        yield family


def _family(kind: type[_Family], name: str, documentation: str, labels: list[str],
            samples: Iterable[tuple[Any, float]]) -> _Family:
    """A metric family of ``kind`` with one sample per ``(label value(s), value)``."""
    family = kind(name, documentation, labels=labels)
    for key, value in samples:
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family


class DaemonCollector(Collector):
    """Reads the daemon's state at scrape time. ``queue_stats`` is filled just before."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self.queue_stats: Any = None

    def collect(self) -> Iterator[Any]:
        d, counter, gauge = self._services, CounterMetricFamily, GaugeMetricFamily
        yield _family(counter, "capd_policy_decisions", "Policy decisions by step (profile, "
                      "consent, loop, hook, fallback) and decision (allow, warn, annotate, "
                      "block, answered, exhausted).", ["kind", "decision"],
                      sorted(d.policy.decisions.items()))
        yield _family(counter, "capd_calls", "Calls by capability and result state.",
                      ["capability", "status"],
                      (((name, status), n) for name, by_status in d.gateway.stats.by_status.items()
                       for status, n in by_status.items()))

        registry = d.registry
        counts = registry.counts()
        yield _family(gauge, "capd_capabilities", "Capabilities by state.", ["state"],
                      [("live", counts["live"]), ("disabled", counts["disabled"])])
        yield gauge("capd_declaration_errors", "Declarations that failed to load.",
                    value=counts["errors"])

        probes = [(tool, result) for tool in sorted(registry.tool_ids())
                  if (result := registry.probe_result(tool)) is not None]
        yield _family(gauge, "capd_tool_up", "1 when the tool's last probe passed.", ["tool"],
                      [(tool, 1.0 if result.ok else 0.0) for tool, result in probes])
        yield _family(gauge, "capd_tool_probe_latency_seconds",
                      "Latency of the tool's last probe.", ["tool"],
                      [(tool, result.latency_s) for tool, result in probes])
        yield _family(gauge, "capd_tool_probe_timestamp_seconds",
                      "When the tool was last probed (epoch).", ["tool"],
                      [(tool, result.checked_at) for tool, result in probes])

        stats = d.rechecker.stats
        yield _family(counter, "capd_rechecks", "Tool rechecks by outcome.", ["outcome"],
                      [("probed", stats.probes), ("cooldown", stats.skipped_cooldown),
                       ("shared", stats.shared)])
        yield counter("capd_capabilities_restored", "Capabilities restored by a recheck.",
                      value=stats.restored)

        reloader = d.reloader
        yield _family(counter, "capd_reloads", "Full reloads by result.", ["result"],
                      [("ok", reloader.ok_count), ("failed", reloader.count - reloader.ok_count)])
        yield gauge("capd_reload_duration_seconds", "Duration of the last reload.",
                    value=reloader.last.duration_s if reloader.last else 0.0)

        if self.queue_stats is not None:
            yield _family(gauge, "capd_queue_jobs", "Retry jobs by state.", ["state"],
                          self.queue_stats.by_state.items())
            yield gauge("capd_queue_oldest_pending_age_seconds",
                        "Age of the oldest pending or leased job.",
                        value=self.queue_stats.oldest_pending_age_s or 0.0)
        if d.sweep is not None:
            yield _family(counter, "capd_sweep_outcomes", "Retry sweep outcomes.", ["outcome"],
                          d.sweep.outcomes.items())


class Metrics:
    """The daemon's metrics registry: the call latency histogram and the state collector."""

    def __init__(self, services: Services) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        call_latency = LatencyHistogram("capd_call_duration_seconds",
                                        "Call latency by capability.")
        self.registry.register(call_latency)
        self.observe_call = call_latency.observe  # one call's latency: (capability, duration_s)
        self.collector = DaemonCollector(services)
        self.registry.register(self.collector)
        self._services = services

    async def render(self) -> bytes:
        """The text exposition, with fresh queue figures."""
        queue = self._services.queue
        self.collector.queue_stats = await queue.stats() if queue is not None else None
        return generate_latest(self.registry)
