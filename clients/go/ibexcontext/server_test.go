package ibexcontext

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
)

// The scripted service's behaviour is picked by the request's model.
const (
	modelFull        = "gpt-4o"
	modelOverloaded  = "scenario-overloaded"  // the service sheds: the caller's messages, reason "overloaded"
	modelInvalid     = "scenario-invalid"     // INVALID_ARGUMENT naming a field
	modelUnavailable = "scenario-unavailable" // UNAVAILABLE (a replica shutting down)
	modelInternal    = "scenario-internal"    // INTERNAL (a server bug)
	modelEmpty       = "scenario-empty"       // a response without messages
	modelSlow        = "scenario-slow"        // answers only when the call's deadline ends

	injectedSystem = "Directive and memories"
	// maxRequestBytes is the scripted server's limit: a bigger request gets gRPC's
	// own RESOURCE_EXHAUSTED, as the real service's does over its limit.
	maxRequestBytes = 64 << 10
)

// seenCall is what the scripted service saw of one call.
type seenCall struct {
	request  *contextv1.AssembleContextRequest
	metadata metadata.MD
	// remaining is the call's deadline as the service saw it (0: none).
	remaining time.Duration
}

// scriptedService is a real gRPC server on a loopback socket.
type scriptedService struct {
	contextv1.UnimplementedContextAssemblyServiceServer
	mu    sync.Mutex
	calls []seenCall
}

func (s *scriptedService) AssembleContext(ctx context.Context, req *contextv1.AssembleContextRequest) (*contextv1.AssembleContextResponse, error) {
	seen := seenCall{request: req}
	seen.metadata, _ = metadata.FromIncomingContext(ctx)
	if deadline, ok := ctx.Deadline(); ok {
		seen.remaining = time.Until(deadline)
	}
	s.mu.Lock()
	s.calls = append(s.calls, seen)
	s.mu.Unlock()

	meta := &contextv1.InjectionMetadata{RequestId: req.GetRequestId()}
	switch req.GetModel() {
	case modelInvalid:
		return nil, status.Error(codes.InvalidArgument, "org_id: must be a UUID")
	case modelUnavailable:
		return nil, status.Error(codes.Unavailable, "shutting down")
	case modelInternal:
		return nil, status.Error(codes.Internal, "handler bug")
	case modelEmpty:
		return &contextv1.AssembleContextResponse{Metadata: meta}, nil
	case modelSlow:
		<-ctx.Done()
		// As a gRPC server whose deadline ran out answers (the Python service's core does):
		// DEADLINE_EXCEEDED. A bare ctx.Err() would go out as UNKNOWN, and this server's
		// deadline (from the grpc-timeout header) can fire before the client's own, so the
		// client would see UNKNOWN with its own deadline not yet passed.
		return nil, status.FromContextError(ctx.Err()).Err()
	case modelOverloaded:
		meta.FallbackReason = "overloaded"
		meta.DegradationLevel = contextv1.DegradationLevel_DEGRADATION_LEVEL_PASS_THROUGH
		return &contextv1.AssembleContextResponse{Messages: req.GetMessages(), Metadata: meta}, nil
	}
	meta.DirectiveInjected = true
	meta.DegradationLevel = contextv1.DegradationLevel_DEGRADATION_LEVEL_FULL
	messages := append([]*contextv1.Message{{Role: "system", Content: injectedSystem}}, req.GetMessages()...)
	return &contextv1.AssembleContextResponse{Messages: messages, Metadata: meta}, nil
}

func (s *scriptedService) seen() []seenCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenCall(nil), s.calls...)
}

func (s *scriptedService) lastCall(t *testing.T) seenCall {
	t.Helper()
	calls := s.seen()
	if len(calls) == 0 {
		t.Fatal("the service saw no call")
	}
	return calls[len(calls)-1]
}

// startScripted serves a scriptedService on 127.0.0.1 until the test ends.
func startScripted(t testing.TB, opts ...grpc.ServerOption) (*scriptedService, string) {
	t.Helper()
	return startScriptedAt(t, "127.0.0.1:0", opts...)
}

// startScriptedAt serves a scriptedService on address until the test ends.
func startScriptedAt(t testing.TB, address string, opts ...grpc.ServerOption) (*scriptedService, string) {
	t.Helper()
	listener, err := net.Listen("tcp", address)
	if err != nil {
		t.Fatal(err)
	}
	service := &scriptedService{}
	server := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(maxRequestBytes)}, opts...)...)
	contextv1.RegisterContextAssemblyServiceServer(server, service)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	return service, listener.Addr().String()
}

// closedAddress is an address nothing listens on (bound, then released).
func closedAddress(t testing.TB) string {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := listener.Addr().String()
	if err := listener.Close(); err != nil {
		t.Fatal(err)
	}
	return address
}

func newTestClient(t testing.TB, target string, opts ...Option) *ContextClient {
	t.Helper()
	client, err := NewContextClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// waitReady bounds the wait for a first connection (tests that need one).
func waitReady(t testing.TB, client *ContextClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !client.WaitReady(ctx) {
		t.Fatal("no connection within 10 s")
	}
}

func userMessages(content string) []*contextv1.Message {
	return []*contextv1.Message{
		{Role: "system", Content: "You are a travel agent."},
		{Role: "user", Content: content},
	}
}

// assertOriginal checks that a fallback returned the caller's very messages.
func assertOriginal(t *testing.T, result Result, original []*contextv1.Message) {
	t.Helper()
	if result.FromService || result.Metadata != nil {
		t.Errorf("FromService=%v Metadata=%v, want a client fallback", result.FromService, result.Metadata)
	}
	if len(result.Messages) != len(original) || (len(original) > 0 && &result.Messages[0] != &original[0]) {
		t.Errorf("messages %v are not the caller's %v", result.Messages, original)
	}
	if result.Err == nil {
		t.Error("a fallback carries the error behind it")
	}
}
