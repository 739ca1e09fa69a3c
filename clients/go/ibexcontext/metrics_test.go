package ibexcontext

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	otelprometheus "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// scrape is what a Prometheus scrape of the client's process would show: the
// OpenTelemetry SDK with its Prometheus exporter, as an application wires them.
func scrapeAfter(t *testing.T, calls func(*ContextClient)) map[string]*dto.MetricFamily {
	t.Helper()
	_, up := startScripted(t)
	registry := prometheus.NewRegistry()
	exporter, err := otelprometheus.New(otelprometheus.WithRegisterer(registry))
	if err != nil {
		t.Fatal(err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	calls(newTestClient(t, up, WithTimeout(generous), WithMeterProvider(provider)))
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, family := range families {
		byName[family.GetName()] = family
	}
	return byName
}

func TestCallsAreCountedUnderTheNamesTheDashboardReads(t *testing.T) {
	families := scrapeAfter(t, func(client *ContextClient) {
		for _, model := range []string{modelFull, modelFull, modelOverloaded, modelInvalid} {
			client.Assemble(context.Background(), Request{OrgID: "org-secret", AgentID: "agent-secret",
				RequestID: "req-secret", Model: model, Messages: userMessages("Zanzibar-PAPAYA")})
		}
	})

	// The dashboard: sum by (result) (rate(ibex_context_client_requests_total[...])).
	requests := families["ibex_context_client_requests_total"]
	if requests == nil || requests.GetType() != dto.MetricType_COUNTER {
		t.Fatalf("no counter ibex_context_client_requests_total among %v", names(families))
	}
	counts := map[string]float64{}
	for _, m := range requests.GetMetric() {
		for _, label := range m.GetLabel() {
			if label.GetName() == "result" {
				counts[label.GetValue()] = m.GetCounter().GetValue()
			} else if !strings.HasPrefix(label.GetName(), "otel_scope_") {
				t.Errorf("label %s=%q: only result is recorded", label.GetName(), label.GetValue())
			}
		}
	}
	want := map[string]float64{"ok": 2, "degraded": 1, ReasonInvalidArgument: 1}
	if len(counts) != len(want) {
		t.Errorf("counts by result %v, want %v", counts, want)
	}
	for result, count := range want {
		if counts[result] != count {
			t.Errorf("result=%s counted %v, want %v", result, counts[result], count)
		}
	}

	// The dashboard: histogram_quantile(..., rate(ibex_context_client_duration_seconds_bucket[...])).
	duration := families["ibex_context_client_duration_seconds"]
	if duration == nil || duration.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("no histogram ibex_context_client_duration_seconds among %v", names(families))
	}
	var observed uint64
	for _, m := range duration.GetMetric() {
		observed += m.GetHistogram().GetSampleCount()
		var bounds []float64
		for _, bucket := range m.GetHistogram().GetBucket() {
			bounds = append(bounds, bucket.GetUpperBound())
		}
		if !slices.Equal(bounds, assemblyBuckets) {
			t.Errorf("buckets %v, want the service's %v", bounds, assemblyBuckets)
		}
	}
	if observed != 4 {
		t.Errorf("%d durations observed, want 4", observed)
	}
}

func TestAFallbackIsCountedUnderItsReason(t *testing.T) {
	families := scrapeAfter(t, func(client *ContextClient) {
		client.Assemble(context.Background(), Request{Model: modelUnavailable, Messages: userMessages("hi")})
		client.Assemble(context.Background(), Request{Model: modelInternal, Messages: userMessages("hi")})
	})

	counts := map[string]float64{}
	for _, m := range families["ibex_context_client_requests_total"].GetMetric() {
		for _, label := range m.GetLabel() {
			if label.GetName() == "result" {
				counts[label.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	// client_error:INTERNAL is counted as client_error, as the Python client does.
	if counts[ReasonUnavailable] != 1 || counts["client_error"] != 1 || len(counts) != 2 {
		t.Errorf("counts by result %v, want client_unavailable and client_error once each", counts)
	}
}

func names(families map[string]*dto.MetricFamily) []string {
	var all []string
	for name := range families {
		all = append(all, name)
	}
	slices.Sort(all)
	return all
}
