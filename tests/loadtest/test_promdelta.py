"""Histogram and counter deltas between two /metrics scrapes."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from loadtest import promdelta

STAGE = "ibex_context_stage_duration_seconds"


def registry_with(observations: dict[str, list[float]], fallbacks: dict[str, int]) -> str:
    registry = CollectorRegistry()
    hist = Histogram(STAGE, "stage", ["stage"], buckets=(0.001, 0.005, 0.01, 0.05), registry=registry)
    counter = Counter("ibex_context_fallbacks", "fallbacks", ["reason"], registry=registry)
    for stage, values in observations.items():
        for v in values:
            hist.labels(stage=stage).observe(v)
    for reason, n in fallbacks.items():
        counter.labels(reason=reason).inc(n)
    return generate_latest(registry).decode()


def test_the_delta_counts_only_what_was_observed_between_the_scrapes() -> None:
    before = registry_with({"cold": [0.002] * 10}, {})
    after = registry_with({"cold": [0.002] * 10 + [0.008] * 4}, {})
    (delta,) = promdelta.histogram_deltas(before, after, STAGE).values()
    assert delta.count == 4
    assert delta.mean == pytest.approx(0.008)


def test_the_quantile_is_interpolated_inside_the_bucket_holding_it() -> None:
    text = registry_with({"cold": [0.0005] * 50 + [0.007] * 50}, {})
    (delta,) = promdelta.histogram_deltas("", text, STAGE).values()
    assert delta.quantile(0.5) == pytest.approx(0.001)
    # 99th of 100: the 49th of 50 in the (5 ms, 10 ms] bucket.
    assert delta.quantile(0.99) == pytest.approx(0.005 + 0.005 * 49 / 50)


def test_a_quantile_beyond_the_last_finite_bucket_is_infinite() -> None:
    text = registry_with({"cold": [0.2] * 10}, {})
    (delta,) = promdelta.histogram_deltas("", text, STAGE).values()
    assert math.isinf(delta.quantile(0.99) or 0.0)


def test_an_empty_delta_has_no_mean_or_quantile() -> None:
    text = registry_with({"cold": [0.002]}, {})
    (delta,) = promdelta.histogram_deltas(text, text, STAGE).values()
    assert delta.count == 0
    assert delta.mean is None and delta.quantile(0.99) is None


def test_series_are_kept_apart_by_label_and_merged_across_processes() -> None:
    worker_a = promdelta.histogram_deltas("", registry_with({"cold": [0.002], "hot": [0.0005]}, {}), STAGE)
    worker_b = promdelta.histogram_deltas("", registry_with({"cold": [0.002, 0.002]}, {}), STAGE)
    merged = promdelta.merge_deltas([worker_a, worker_b])
    counts = {dict(key)["stage"]: d.count for key, d in merged.items()}
    assert counts == {"cold": 3, "hot": 1}


def test_counter_deltas_by_label() -> None:
    before = registry_with({}, {"cold_timeout": 2})
    after = registry_with({}, {"cold_timeout": 5, "redis_unavailable": 1})
    deltas = {
        dict(k)["reason"]: v
        for k, v in promdelta.counter_deltas(before, after, "ibex_context_fallbacks").items()
    }
    assert deltas == {"cold_timeout": 3, "redis_unavailable": 1}
