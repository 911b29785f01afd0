"""capd's own call-latency histogram renders exactly what the client library's would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from capd.sidecar.server._metrics import LATENCY_BUCKETS, LatencyHistogram


def test_the_latency_histogram_matches_the_client_librarys() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    histogram = LatencyHistogram("capd_call_duration_seconds", "Call latency by capability.")
    ours.register(histogram)
    reference = Histogram("capd_call_duration_seconds", "Call latency by capability.",
                          ["capability"], buckets=LATENCY_BUCKETS, registry=theirs)
    # on a bound (le is inclusive), between bounds, under the first, past the last
    for value in (0.0, 0.0001, 0.0005, 0.0006, 0.003, 0.2, 5.0, 30.0, 31.0, 1000.0):
        for capability in ("a.b", "notes.search"):  # ours are sorted; theirs first-seen
            histogram.observe(capability, value)
            reference.labels(capability).observe(value)
    expected = [line for line in generate_latest(theirs).decode().splitlines()
                if "_created" not in line]  # the creation time series is left out
    assert generate_latest(ours).decode().splitlines() == expected
