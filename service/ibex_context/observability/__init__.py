"""Metrics, traces and logs, all derived from each call's ``Assembly`` after the response.

Wiring (once, in the app factory)::

    metrics = Metrics(CollectorRegistry())
    tracing = Tracing.from_settings(settings)
    configure_logging(settings.log_level, settings.log_format)
    observer = CallObserver(metrics=metrics, tracing=tracing, log=logging.getLogger("ibex_context.access"))
    server = ServiceServer(methods, max_request_bytes=..., observer=observer)  # server/grpc_server.py
    metrics_server = start_metrics_server(settings.metrics_port, metrics.registry)  # .port, await .close()

The AssembleContext handler tells its ``AssemblyObserver`` (``CurrentCallObserver``) the
call's ``Assembly`` (made once, never changed) after the send, or its ``Rejection``; the
observer attaches it to the call's ``CallState``, which the listeners read when the call ends.
"""

from ibex_context.observability.calls import CallObserver
from ibex_context.observability.exposition import HealthStatus, MetricsServer, start_metrics_server
from ibex_context.observability.logging import configure_logging
from ibex_context.observability.metrics import Metrics
from ibex_context.observability.state import CallState, current_call
from ibex_context.observability.tracing import Tracing

__all__ = [
    "CallObserver",
    "CallState",
    "HealthStatus",
    "Metrics",
    "MetricsServer",
    "Tracing",
    "configure_logging",
    "current_call",
    "start_metrics_server",
]
