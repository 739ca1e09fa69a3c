"""Histogram buckets that the service's metrics and the proxy's client both use.

A leaf module of the client distribution: the service imports it from here, and the
client never imports the service (its observability, the OpenTelemetry SDK) for a constant.
"""

from __future__ import annotations

# Seconds. Dense around the 40-50 ms deadline, where the interesting percentiles live.
ASSEMBLY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25,
)  # fmt: skip
