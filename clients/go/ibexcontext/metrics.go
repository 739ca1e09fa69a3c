package ibexcontext

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The Python client's metrics (ibex_context_client.metrics), which the chart's
// dashboard reads in its proxy panels: a Prometheus exporter (or the collector)
// names them ibex_context_client_requests_total{result} and
// ibex_context_client_duration_seconds.
const (
	requestsMetric = "ibex_context_client_requests"
	durationMetric = "ibex_context_client_duration"
)

// assemblyBuckets are the service's and the Python client's histogram buckets
// (ibex_context/buckets.py), in seconds: dense around the 45 ms deadline.
var assemblyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25}

// resultLabels are the values of the result attribute: ok, degraded (by the
// service), or the client fallback's reason up to its first colon. A fixed set:
// no tenant id, request id or content is ever an attribute.
var resultLabels = []string{
	"ok", "degraded", ReasonTimeout, ReasonUnavailable, ReasonInvalidArgument, ReasonCanceled,
	strings.TrimSuffix(ReasonErrorPrefix, ":"),
}

// clientMetrics records each Assemble's result and wall time.
type clientMetrics struct {
	requests metric.Int64Counter
	duration metric.Float64Histogram
	// byResult holds each result's attribute set, made once: recording allocates nothing.
	byResult map[string]metric.MeasurementOption
}

func newClientMetrics(provider metric.MeterProvider) (*clientMetrics, error) {
	meter := provider.Meter(instrumentationName)
	requests, err := meter.Int64Counter(requestsMetric,
		metric.WithDescription("AssembleContext calls by result: ok, degraded (by the service) or the client fallback."))
	if err != nil {
		return nil, err
	}
	duration, err := meter.Float64Histogram(durationMetric,
		metric.WithDescription("Client-side wall time of AssembleContext, fallbacks included."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(assemblyBuckets...))
	if err != nil {
		return nil, err
	}
	m := &clientMetrics{requests: requests, duration: duration, byResult: map[string]metric.MeasurementOption{}}
	for _, label := range resultLabels {
		m.byResult[label] = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", label)))
	}
	return m, nil
}

func (m *clientMetrics) record(ctx context.Context, result *Result) {
	label := resultLabel(result)
	attributes, known := m.byResult[label]
	if !known {
		attributes = m.byResult[strings.TrimSuffix(ReasonErrorPrefix, ":")]
	}
	m.requests.Add(ctx, 1, attributes)
	m.duration.Record(ctx, result.Elapsed.Seconds(), attributes)
}

// resultLabel is the Python client's: ok, degraded, or the fallback reason up to ":".
func resultLabel(result *Result) string {
	switch {
	case result.FromService && result.FallbackReason == "":
		return "ok"
	case result.FromService:
		return "degraded"
	}
	label, _, _ := strings.Cut(result.FallbackReason, ":")
	return label
}
