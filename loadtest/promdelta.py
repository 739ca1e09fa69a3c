"""Before/after scrapes of the service's ``/metrics`` -> per-stage figures for one run.

Pure functions over Prometheus text exposition: the difference between two scrapes
of a histogram gives the calls observed during the run, their mean (sum/count) and
an approximate percentile (linear interpolation inside the bucket that holds it, so
it is only as precise as the bucket bounds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

LabelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class HistogramState:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending
    count: float
    sum: float


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    count: float
    sum: float
    buckets: tuple[tuple[float, float], ...]

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Approximate q-quantile; +Inf when it falls in the overflow bucket."""
        if not self.count:
            return None
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return math.inf
                in_bucket = cumulative - lower_count
                fraction = (rank - lower_count) / in_bucket if in_bucket else 1.0
                return lower_bound + (bound - lower_bound) * fraction
            lower_bound, lower_count = bound, cumulative
        return math.inf


def _key(labels: Mapping[str, str], drop: Iterable[str] = ("le",)) -> LabelKey:
    dropped = set(drop)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in dropped))


def parse_histograms(text: str, name: str) -> dict[LabelKey, HistogramState]:
    """Every series of histogram ``name`` (without the _bucket suffix), by label set."""
    buckets: dict[LabelKey, list[tuple[float, float]]] = {}
    counts: dict[LabelKey, float] = {}
    sums: dict[LabelKey, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            key = _key(sample.labels)
            if sample.name == f"{name}_bucket":
                buckets.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
            elif sample.name == f"{name}_count":
                counts[key] = sample.value
            elif sample.name == f"{name}_sum":
                sums[key] = sample.value
    return {
        key: HistogramState(tuple(sorted(b)), counts.get(key, 0.0), sums.get(key, 0.0))
        for key, b in buckets.items()
    }


def parse_counters(text: str, name: str) -> dict[LabelKey, float]:
    """Every series of counter ``name`` (the ``_total`` sample), by label set."""
    values: dict[LabelKey, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name in (f"{name}_total", name):
                values[_key(sample.labels)] = sample.value
    return values


def histogram_delta(before: HistogramState | None, after: HistogramState) -> HistogramDelta:
    if before is None:
        return HistogramDelta(after.count, after.sum, after.buckets)
    previous = dict(before.buckets)
    return HistogramDelta(
        count=after.count - before.count,
        sum=after.sum - before.sum,
        buckets=tuple((bound, value - previous.get(bound, 0.0)) for bound, value in after.buckets),
    )


def histogram_deltas(before_text: str, after_text: str, name: str) -> dict[LabelKey, HistogramDelta]:
    before = parse_histograms(before_text, name)
    return {
        key: histogram_delta(before.get(key), state)
        for key, state in parse_histograms(after_text, name).items()
    }


def counter_deltas(before_text: str, after_text: str, name: str) -> dict[LabelKey, float]:
    before = parse_counters(before_text, name)
    return {key: value - before.get(key, 0.0) for key, value in parse_counters(after_text, name).items()}


def merge_deltas(parts: Iterable[Mapping[LabelKey, HistogramDelta]]) -> dict[LabelKey, HistogramDelta]:
    """Sums the deltas of several processes (one scrape per server worker)."""
    merged: dict[LabelKey, HistogramDelta] = {}
    for part in parts:
        for key, delta in part.items():
            seen = merged.get(key)
            if seen is None:
                merged[key] = delta
                continue
            mine = dict(delta.buckets)
            merged[key] = HistogramDelta(
                count=seen.count + delta.count,
                sum=seen.sum + delta.sum,
                buckets=tuple((b, v + mine.get(b, 0.0)) for b, v in seen.buckets),
            )
    return merged
