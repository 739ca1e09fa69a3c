package ibexcontext

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestEveryCallRecordsAClientSpanWithoutTenantOrContent(t *testing.T) {
	_, up := startScripted(t)
	secrets := Request{
		OrgID:     "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01",
		AgentID:   "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",
		SessionID: "9a1b2c3d-0000-4e6a-8c7d-5d2e9c1a3b4f",
		RequestID: "req-Quokka-7731",
	}
	tests := []struct {
		name        string
		target      string
		model       string
		fromService bool
		wantReason  string
	}{
		{name: "answered", target: up, model: modelFull, fromService: true},
		{name: "degraded by the service", target: up, model: modelOverloaded, fromService: true, wantReason: "overloaded"},
		{name: "fell back", target: up, model: modelInvalid, wantReason: ReasonInvalidArgument},
		{name: "unreachable", target: closedAddress(t), model: modelFull, wantReason: ReasonUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recorder := tracetest.NewSpanRecorder()
			provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
			client := newTestClient(t, tt.target, WithTimeout(generous), WithTracerProvider(provider))
			req := secrets
			req.Model = tt.model
			req.Messages = userMessages("Zanzibar-PAPAYA prefers dark roast")

			client.Assemble(context.Background(), req)

			spans := recorder.Ended()
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			span := spans[0]
			if span.Name() != spanName || span.SpanKind() != trace.SpanKindClient {
				t.Errorf("span %q of kind %v", span.Name(), span.SpanKind())
			}
			attrs := map[attribute.Key]attribute.Value{}
			for _, kv := range span.Attributes() {
				attrs[kv.Key] = kv.Value
			}
			if attrs["rpc.system"].AsString() != "grpc" || attrs["rpc.method"].AsString() != "AssembleContext" {
				t.Errorf("rpc attributes: %v", span.Attributes())
			}
			if attrs[fromServiceKey].AsBool() != tt.fromService || attrs[fallbackReasonKey].AsString() != tt.wantReason {
				t.Errorf("outcome attributes: %v", span.Attributes())
			}
			if wantError := !tt.fromService; (span.Status().Code == codes.Error) != wantError {
				t.Errorf("status %v, want an error status: %v", span.Status(), wantError)
			}
			everything := span.Name() + span.Status().Description
			for _, kv := range span.Attributes() {
				everything += " " + kv.Value.Emit()
			}
			for _, secret := range []string{secrets.OrgID, secrets.AgentID, secrets.SessionID, secrets.RequestID, "PAPAYA", "org_id"} {
				if strings.Contains(everything, secret) {
					t.Errorf("the span holds %q: %s", secret, everything)
				}
			}
		})
	}
}

func TestTheTraceContextGoesToTheServiceAsTraceparent(t *testing.T) {
	service, target := startScripted(t)
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	client := newTestClient(t, target, WithTimeout(generous), WithTracerProvider(provider),
		WithPropagator(propagation.TraceContext{}))

	client.Assemble(context.Background(), Request{Model: modelFull, Messages: userMessages("hi")})

	got := service.lastCall(t).metadata.Get("traceparent")
	spans := recorder.Ended()
	if len(got) != 1 || len(spans) != 1 {
		t.Fatalf("traceparent %v with %d spans", got, len(spans))
	}
	if want := spans[0].SpanContext().SpanID().String(); !strings.Contains(got[0], want) {
		t.Errorf("traceparent %q does not name the client span %s", got[0], want)
	}
}
