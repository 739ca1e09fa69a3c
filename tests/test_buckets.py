"""``buckets`` holds the latency buckets the client shares with the service's metrics."""

from __future__ import annotations

from ibex_context import buckets
from ibex_context.observability import metrics


def test_the_client_and_the_service_bucket_assembly_latency_alike() -> None:
    # observability.metrics still spells the tuple out (its module is being reworked);
    # until it imports it from ``buckets``, this keeps the two from drifting apart.
    assert metrics.ASSEMBLY_BUCKETS == buckets.ASSEMBLY_BUCKETS


def test_the_buckets_are_increasing_and_straddle_the_deadline() -> None:
    values = buckets.ASSEMBLY_BUCKETS
    assert list(values) == sorted(set(values))
    assert values[0] < 0.040 < 0.045 < values[-1]
