package ibexcontext

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
)

// scriptedMemory answers GetDirective: INVALID_ARGUMENT for the org "bad", else a
// directive; it notes the deadline each call arrived with.
type scriptedMemory struct {
	contextv1.UnimplementedMemoryServiceServer
	remaining chan time.Duration
}

func (s *scriptedMemory) GetDirective(ctx context.Context, req *contextv1.GetDirectiveRequest) (*contextv1.GetDirectiveResponse, error) {
	remaining := time.Duration(0)
	if deadline, ok := ctx.Deadline(); ok {
		remaining = time.Until(deadline)
	}
	s.remaining <- remaining
	if req.GetOrgId() == "bad" {
		return nil, status.Error(codes.InvalidArgument, "org_id: must be a UUID")
	}
	return &contextv1.GetDirectiveResponse{Exists: true, Content: "Be concise.", Version: 3}, nil
}

func startScriptedMemory(t *testing.T) (*scriptedMemory, string) {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	service := &scriptedMemory{remaining: make(chan time.Duration, 10)}
	server := grpc.NewServer()
	contextv1.RegisterMemoryServiceServer(server, service)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	return service, listener.Addr().String()
}

func newMemoryClient(t *testing.T, target string, opts ...Option) *MemoryClient {
	t.Helper()
	client, err := NewMemoryClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func TestMemoryCallsWithoutADeadlineGetOne(t *testing.T) {
	service, target := startScriptedMemory(t)
	tests := []struct {
		name                 string
		opts                 []Option
		callerWait           time.Duration // 0: no caller deadline
		wantAtMost, wantOver time.Duration
	}{
		{name: "the default", wantAtMost: DefaultMemoryTimeout},
		{name: "WithTimeout", opts: []Option{WithTimeout(3 * time.Second)}, wantAtMost: 3 * time.Second},
		{name: "the caller's is kept", callerWait: time.Hour, wantAtMost: time.Hour, wantOver: DefaultMemoryTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := newMemoryClient(t, target, tt.opts...)
			ctx := context.Background()
			if tt.callerWait > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.callerWait)
				defer cancel()
			}

			reply, err := client.GetDirective(ctx, &contextv1.GetDirectiveRequest{OrgId: "org", AgentId: "agent"})

			if err != nil || reply.GetContent() != "Be concise." || reply.GetVersion() != 3 {
				t.Fatalf("GetDirective = %v, %v", reply, err)
			}
			if remaining := <-service.remaining; remaining <= tt.wantOver || remaining > tt.wantAtMost {
				t.Errorf("the service saw %v left, want more than %v and at most %v", remaining, tt.wantOver, tt.wantAtMost)
			}
		})
	}
}

func TestMemoryCallsReturnTheServicesErrors(t *testing.T) {
	_, target := startScriptedMemory(t)
	client := newMemoryClient(t, target)

	_, err := client.GetDirective(context.Background(), &contextv1.GetDirectiveRequest{OrgId: "bad", AgentId: "agent"})

	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("err = %v, want INVALID_ARGUMENT", err)
	}
}

func TestMemoryClientRefusesATokenWithoutTLS(t *testing.T) {
	if client, err := NewMemoryClient("127.0.0.1:1", WithBearerToken(StaticToken("t"))); err == nil {
		_ = client.Close()
		t.Error("NewMemoryClient accepted a token without TLS")
	}
}
