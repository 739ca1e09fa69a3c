package ibexcontext

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

const (
	instrumentationName = "github.com/ibex-context/ibex-context/clients/go/ibexcontext"
	spanName            = "ibex.context.v1.ContextAssemblyService/AssembleContext"
)

// The span's attributes name the RPC and the outcome only: no tenant id, request
// id or content ever reaches a span.
var (
	spanStart = []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("rpc.system", "grpc"),
			attribute.String("rpc.service", "ibex.context.v1.ContextAssemblyService"),
			attribute.String("rpc.method", "AssembleContext"),
		),
	}
	fromServiceKey    = attribute.Key("ibex.from_service")
	fallbackReasonKey = attribute.Key("ibex.fallback_reason")
)

func endSpan(span trace.Span, result *Result) {
	if span.IsRecording() {
		span.SetAttributes(fromServiceKey.Bool(result.FromService))
		if result.FallbackReason != "" {
			span.SetAttributes(fallbackReasonKey.String(result.FallbackReason))
		}
		if !result.FromService {
			span.SetStatus(codes.Error, result.FallbackReason)
		}
	}
	span.End()
}

// metadataCarrier lets a propagator write the trace context into gRPC metadata.
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if values := metadata.MD(m).Get(key); len(values) > 0 {
		return values[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	return keys
}
