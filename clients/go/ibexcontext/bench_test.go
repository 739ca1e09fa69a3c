package ibexcontext

import (
	"context"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
)

// benchRequest is a proxy's typical request: a system prompt and a few turns
// (about 2 KB), answered by the scripted service with one injected message.
func benchRequest() Request {
	turn := strings.Repeat("Which seat should I book for my flight to Berlin? ", 8)
	return Request{
		OrgID: "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01", AgentID: "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",
		SessionID: "9a1b2c3d-0000-4e6a-8c7d-5d2e9c1a3b4f", Model: modelFull, RequestID: "bench",
		Messages: []*contextv1.Message{
			{Role: "system", Content: strings.Repeat("You are Acme Travel's support assistant. ", 10)},
			{Role: "user", Content: turn},
			{Role: "assistant", Content: turn},
			{Role: "user", Content: turn},
		},
	}
}

// BenchmarkAssemble compares, call by call against the same loopback server, a
// bare grpc-go call (pick_first, a 45 ms context, the generated stub) with
// ContextClient.Assemble (round robin, deadline cap, metadata, span, metrics,
// fallback checks). Besides ns/op it reports each call's median and p99 and the process's
// CPU per call (client and server share the process: the difference is the client's).
func BenchmarkAssemble(b *testing.B) {
	_, target := startScripted(b)
	req := benchRequest()
	proto := &contextv1.AssembleContextRequest{
		OrgId: req.OrgID, AgentId: req.AgentID, SessionId: req.SessionID, Model: req.Model,
		RequestId: req.RequestID, Messages: req.Messages,
	}

	b.Run("raw", func(b *testing.B) {
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		stub := contextv1.NewContextAssemblyServiceClient(conn)
		measure(b, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
			defer cancel()
			_, err := stub.AssembleContext(ctx, proto)
			return err == nil
		})
	})
	b.Run("client", func(b *testing.B) {
		client := newTestClient(b, target)
		waitReady(b, client)
		measure(b, func() bool { return answered(b, client.Assemble(context.Background(), req)) })
	})
	b.Run("client_sdk", func(b *testing.B) {
		// Real OpenTelemetry SDK providers: every span sampled and recorded, every
		// metric aggregated (no exporter: the export's cost is the application's choice).
		provider := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
		meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		client := newTestClient(b, target, WithTracerProvider(provider), WithMeterProvider(meters))
		waitReady(b, client)
		measure(b, func() bool { return answered(b, client.Assemble(context.Background(), req)) })
	})
}

// answered says whether the service answered, logging why not.
func answered(b *testing.B, result Result) bool {
	if !result.FromService {
		b.Logf("fell back after %v: %s (%v)", result.Elapsed, result.FallbackReason, result.Err)
	}
	return result.FromService
}

// measure runs call b.N times (after a warm-up), one at a time, and reports the
// per-call median, p99 and CPU. A failed call fails the benchmark: a timing of
// fallbacks is not a timing of calls.
func measure(b *testing.B, call func() bool) {
	b.Helper()
	for i := 0; i < 200; i++ {
		call()
	}
	durations := make([]time.Duration, b.N)
	cpuBefore := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		ok := call()
		durations[i] = time.Since(start)
		if !ok {
			b.Fatalf("call %d failed", i)
		}
	}
	b.StopTimer()
	cpu := processCPU() - cpuBefore
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	b.ReportMetric(float64(durations[len(durations)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(durations[len(durations)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

func processCPU() time.Duration {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}
