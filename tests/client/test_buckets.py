"""``buckets`` holds the latency buckets the client shares with the service's metrics."""

from __future__ import annotations

from ibex_context.observability import metrics
from ibex_context_client import buckets


def test_the_client_and_the_service_bucket_assembly_latency_with_one_tuple() -> None:
    assert metrics.ASSEMBLY_BUCKETS is buckets.ASSEMBLY_BUCKETS


def test_the_buckets_are_increasing_and_straddle_the_deadline() -> None:
    values = buckets.ASSEMBLY_BUCKETS
    assert list(values) == sorted(set(values))
    assert values[0] < 0.040 < 0.045 < values[-1]
