package ibexcontext

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// generous keeps a machine under load from turning a case that is not about
// the deadline into a timeout.
const generous = 10 * time.Second

func TestEveryFailureReturnsTheCallersMessages(t *testing.T) {
	_, up := startScripted(t)
	down := closedAddress(t)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	shortDeadline, cancelShort := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancelShort()

	tests := []struct {
		name       string
		target     string
		model      string
		content    string
		ctx        context.Context
		timeout    time.Duration // the client's cap; generous unless the case is about it
		wantReason string
	}{
		{name: "unreachable", target: down, model: modelFull, wantReason: ReasonUnavailable},
		{name: "unreachable by dns", target: "dns:///" + down, model: modelFull, wantReason: ReasonUnavailable},
		{name: "slower than the 45 ms cap", target: up, model: modelSlow, timeout: DefaultTimeout, wantReason: ReasonTimeout},
		{name: "slower than the caller's deadline", target: up, model: modelSlow, ctx: shortDeadline, wantReason: ReasonTimeout},
		{name: "caller canceled", target: up, model: modelFull, ctx: canceled, wantReason: ReasonCanceled},
		{name: "INVALID_ARGUMENT", target: up, model: modelInvalid, wantReason: ReasonInvalidArgument},
		{name: "RESOURCE_EXHAUSTED: over the size limit", target: up, model: modelFull,
			content: strings.Repeat("x", maxRequestBytes), wantReason: ReasonInvalidArgument},
		{name: "UNAVAILABLE", target: up, model: modelUnavailable, wantReason: ReasonUnavailable},
		{name: "INTERNAL", target: up, model: modelInternal, wantReason: "client_error:INTERNAL"},
		{name: "no messages in the response", target: up, model: modelEmpty, wantReason: "client_error:empty_response"},
		{name: "invalid UTF-8", target: up, model: modelFull, content: "caf\xe9", wantReason: "client_error:bad_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timeout := tt.timeout
			if timeout == 0 {
				timeout = generous
			}
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			content := tt.content
			if content == "" {
				content = "Can my dog fly with me?"
			}
			client := newTestClient(t, tt.target, WithTimeout(timeout))
			original := userMessages(content)

			result := client.Assemble(ctx, Request{OrgID: "org", AgentID: "agent", Model: tt.model, Messages: original})

			if result.FallbackReason != tt.wantReason {
				t.Errorf("FallbackReason = %q (%v), want %q", result.FallbackReason, result.Err, tt.wantReason)
			}
			assertOriginal(t, result, original)
			if !result.Degraded() {
				t.Error("a fallback is degraded")
			}
		})
	}
}

func TestInvalidArgumentKeepsTheServicesWordsForTheCallersLog(t *testing.T) {
	_, target := startScripted(t)
	client := newTestClient(t, target, WithTimeout(generous))

	result := client.Assemble(context.Background(), Request{Model: modelInvalid, Messages: userMessages("hi")})

	if result.Err == nil || !strings.Contains(result.Err.Error(), "org_id") {
		t.Errorf("Err = %v, want the field the service named", result.Err)
	}
}

func TestAnOverloadedServiceAnswersWithTheCallersMessagesAndSaysSo(t *testing.T) {
	_, target := startScripted(t)
	client := newTestClient(t, target, WithTimeout(generous))
	original := userMessages("Can my dog fly with me?")

	result := client.Assemble(context.Background(), Request{Model: modelOverloaded, Messages: original})

	if !result.FromService || result.FallbackReason != "overloaded" || !result.Degraded() {
		t.Fatalf("got FromService=%v FallbackReason=%q, want the service's overloaded answer", result.FromService, result.FallbackReason)
	}
	if len(result.Messages) != len(original) {
		t.Fatalf("got %d messages, want the caller's %d", len(result.Messages), len(original))
	}
	for i, message := range result.Messages {
		if message.GetRole() != original[i].GetRole() || message.GetContent() != original[i].GetContent() {
			t.Errorf("message %d = %v, want %v", i, message, original[i])
		}
	}
}

func TestAFullAssemblyReturnsTheServicesMessagesAndMetadata(t *testing.T) {
	service, target := startScripted(t)
	client := newTestClient(t, target, WithTimeout(generous))
	original := userMessages("Can my dog fly with me?")

	result := client.Assemble(context.Background(), Request{
		OrgID: "org-1", AgentID: "agent-1", SessionID: "session-1", Model: modelFull,
		RequestID: "req-42", Messages: original,
	})

	if !result.FromService || result.Degraded() || result.Err != nil {
		t.Fatalf("got FromService=%v FallbackReason=%q Err=%v, want a full assembly", result.FromService, result.FallbackReason, result.Err)
	}
	if len(result.Messages) != 3 || result.Messages[0].GetContent() != injectedSystem {
		t.Errorf("messages = %v, want the injected system message first", result.Messages)
	}
	if got := result.Metadata.GetRequestId(); got != "req-42" {
		t.Errorf("metadata request id = %q, want req-42", got)
	}
	if result.Elapsed <= 0 {
		t.Errorf("Elapsed = %v", result.Elapsed)
	}
	call := service.lastCall(t)
	request := call.request
	if request.GetOrgId() != "org-1" || request.GetAgentId() != "agent-1" || request.GetSessionId() != "session-1" ||
		request.GetModel() != modelFull || request.GetRequestId() != "req-42" || len(request.GetMessages()) != 2 {
		t.Errorf("the service saw %v", request)
	}
	if got := call.metadata.Get("x-request-id"); len(got) != 1 || got[0] != "req-42" {
		t.Errorf("x-request-id metadata = %v, want [req-42]", got)
	}
}

func TestTheCallersOwnMetadataGoesAlong(t *testing.T) {
	service, target := startScripted(t)
	client := newTestClient(t, target, WithTimeout(generous))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant-route", "blue")

	client.Assemble(ctx, Request{Model: modelFull, RequestID: "req-1", Messages: userMessages("hi")})

	md := service.lastCall(t).metadata
	if got := md.Get("x-tenant-route"); len(got) != 1 || got[0] != "blue" {
		t.Errorf("x-tenant-route = %v, want [blue]", got)
	}
	if got := md.Get("x-request-id"); len(got) != 1 || got[0] != "req-1" {
		t.Errorf("x-request-id = %v, want [req-1]", got)
	}
}

// deadlineRecorder is a client interceptor that notes the deadline each call
// leaves with, before anything goes on the wire.
type deadlineRecorder struct{ remaining []time.Duration }

func (d *deadlineRecorder) intercept(ctx context.Context, method string, req, reply any,
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	remaining := time.Duration(0)
	if deadline, ok := ctx.Deadline(); ok {
		remaining = time.Until(deadline)
	}
	d.remaining = append(d.remaining, remaining)
	return invoker(ctx, method, req, reply, cc, opts...)
}

func TestTheDeadlineIsTheCallersCappedAtTheTimeout(t *testing.T) {
	_, target := startScripted(t)
	tests := []struct {
		name       string
		timeout    time.Duration // 0: the default
		callerWait time.Duration // 0: no caller deadline
		wantAtMost time.Duration
	}{
		{name: "no caller deadline: the 45 ms cap", wantAtMost: DefaultTimeout},
		{name: "a later caller deadline is capped", callerWait: time.Minute, wantAtMost: DefaultTimeout},
		{name: "an earlier caller deadline is kept", callerWait: 20 * time.Millisecond, wantAtMost: 20 * time.Millisecond},
		{name: "another cap", timeout: 2 * time.Second, callerWait: time.Minute, wantAtMost: 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recorder := &deadlineRecorder{}
			opts := []Option{WithDialOptions(grpc.WithUnaryInterceptor(recorder.intercept))}
			if tt.timeout > 0 {
				opts = append(opts, WithTimeout(tt.timeout))
			}
			client := newTestClient(t, target, opts...)
			ctx := context.Background()
			if tt.callerWait > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.callerWait)
				defer cancel()
			}

			client.Assemble(ctx, Request{Model: modelFull, Messages: userMessages("hi")})

			if len(recorder.remaining) != 1 {
				t.Fatalf("%d calls went out, want 1", len(recorder.remaining))
			}
			if remaining := recorder.remaining[0]; remaining <= 0 || remaining > tt.wantAtMost {
				t.Errorf("the call left with %v of deadline, want at most %v", remaining, tt.wantAtMost)
			}
		})
	}
}

func TestTheServiceSeesTheCappedDeadline(t *testing.T) {
	service, target := startScripted(t)
	client := newTestClient(t, target, WithTimeout(generous))
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()

	client.Assemble(ctx, Request{Model: modelFull, Messages: userMessages("hi")})

	if remaining := service.lastCall(t).remaining; remaining <= 0 || remaining > generous {
		t.Errorf("the service saw %v left, want at most %v (grpc-timeout)", remaining, generous)
	}
}

// roundRobinClient dials a name that resolves to addresses (as a headless
// Service's does, through the test's resolver instead of DNS).
func roundRobinClient(t *testing.T, addresses ...string) *ContextClient {
	t.Helper()
	builder := manual.NewBuilderWithScheme("pods")
	state := resolver.State{}
	for _, address := range addresses {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: address})
	}
	builder.InitialState(state)
	return newTestClient(t, "pods:///ibex-context-headless:50051",
		WithTimeout(generous), WithDialOptions(grpc.WithResolvers(builder)))
}

func TestCallsGoRoundRobinOverEveryAddress(t *testing.T) {
	first, firstAddress := startScripted(t)
	second, secondAddress := startScripted(t)
	client := roundRobinClient(t, firstAddress, secondAddress)

	// Both connect in the background; until both are up, calls go to the one that is.
	until := time.Now().Add(generous)
	for len(first.seen()) == 0 || len(second.seen()) == 0 {
		if time.Now().After(until) {
			break
		}
		if result := client.Assemble(context.Background(), Request{Model: modelFull, Messages: userMessages("hi")}); !result.FromService {
			t.Fatalf("a call fell back: %s (%v)", result.FallbackReason, result.Err)
		}
		time.Sleep(time.Millisecond)
	}
	if len(first.seen()) == 0 || len(second.seen()) == 0 {
		t.Errorf("calls per address: %d and %d, want both used", len(first.seen()), len(second.seen()))
	}
}

func TestAnAddressThatRefusesIsSkipped(t *testing.T) {
	service, up := startScripted(t)
	client := roundRobinClient(t, closedAddress(t), up)
	waitReady(t, client)

	for i := 0; i < 20; i++ {
		result := client.Assemble(context.Background(), Request{Model: modelFull, Messages: userMessages("hi")})
		if !result.FromService {
			t.Fatalf("call %d fell back: %s (%v)", i, result.FallbackReason, result.Err)
		}
	}
	if got := len(service.seen()); got != 20 {
		t.Errorf("the live address answered %d calls, want 20", got)
	}
}

func TestOptionsThatCannotWorkAreRefused(t *testing.T) {
	tests := []struct {
		name   string
		target string
		opts   []Option
	}{
		{name: "empty target", target: ""},
		{name: "a token without TLS", target: "127.0.0.1:1", opts: []Option{WithBearerToken(StaticToken("t"))}},
		{name: "a zero timeout", target: "127.0.0.1:1", opts: []Option{WithTimeout(0)}},
		{name: "nil TLS config", target: "127.0.0.1:1", opts: []Option{WithTLS(nil)}},
		{name: "nil token source", target: "127.0.0.1:1", opts: []Option{WithBearerToken(nil)}},
		{name: "nil tracer provider", target: "127.0.0.1:1", opts: []Option{WithTracerProvider(nil)}},
		{name: "nil propagator", target: "127.0.0.1:1", opts: []Option{WithPropagator(nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, err := NewContextClient(tt.target, tt.opts...)
			if err == nil {
				_ = client.Close()
				t.Fatal("NewContextClient accepted it")
			}
		})
	}
}

func TestAClientOverTheCallersConnection(t *testing.T) {
	_, target := startScripted(t)
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := NewContextClientFromConn(conn, WithBearerToken(StaticToken("t"))); err == nil {
		t.Error("connection options were accepted with the caller's connection")
	}
	client, err := NewContextClientFromConn(conn, WithTimeout(generous))
	if err != nil {
		t.Fatal(err)
	}

	result := client.Assemble(context.Background(), Request{Model: modelFull, Messages: userMessages("hi")})

	if !result.FromService {
		t.Errorf("fell back: %s (%v)", result.FallbackReason, result.Err)
	}
	if err := client.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if state := conn.GetState().String(); state == "SHUTDOWN" {
		t.Error("the client closed the caller's connection")
	}
}
