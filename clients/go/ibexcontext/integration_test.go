//go:build integration

package ibexcontext

// The client against the real Python service: `ibex-context dev` (embedded Redis
// and PostgreSQL+pgvector, the demo tenants, the MiniLM embedder) started by the
// test through internal/devservice (IBEX_CONTEXT_BIN names the command).
// Run: go test -tags integration ./... (scripts/test-go does).

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
	"github.com/ibex-context/ibex-context/clients/go/internal/devservice"
)

const (
	demoOrg      = devservice.DemoOrg
	demoAgent    = devservice.DemoAgent
	demoQuestion = devservice.DemoQuestion
	demoMemory   = devservice.DemoMemory
	// The service refuses requests over this many bytes (RESOURCE_EXHAUSTED).
	serviceMaxRequestBytes = 65536
	connectionAge          = time.Second
)

func newUUID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func demoRequest(requestID string) Request {
	return Request{
		OrgID: demoOrg, AgentID: demoAgent, Model: "gpt-4o", RequestID: requestID,
		Messages: []*contextv1.Message{{Role: "user", Content: demoQuestion}},
	}
}

// TestAgainstTheRealService runs its cases in order: the last ones freeze and
// then stop the service.
func TestAgainstTheRealService(t *testing.T) {
	service := devservice.Start(t,
		// Connections aged every second (the default is 60 s): the test sees them replaced.
		fmt.Sprintf("IBEX_GRPC_MAX_CONNECTION_AGE_SECONDS=%d", int(connectionAge.Seconds())),
		fmt.Sprintf("IBEX_MAX_REQUEST_BYTES=%d", serviceMaxRequestBytes))
	// localhost may resolve to ::1 as well, where nothing listens: round robin
	// uses the address that answers.
	target := "dns:///localhost:" + service.Port
	client := newTestClient(t, target, WithTimeout(generous))
	waitReady(t, client)
	capped := newTestClient(t, target) // the 45 ms default
	waitReady(t, capped)

	t.Run("the demo question gets the directive and the dog", func(t *testing.T) {
		req := demoRequest("go-integration-1")

		result := client.Assemble(context.Background(), req)

		if !result.FromService {
			t.Fatalf("fell back: %s (%v)", result.FallbackReason, result.Err)
		}
		if got := result.Metadata.GetRequestId(); got != "go-integration-1" {
			t.Errorf("request id %q, want go-integration-1", got)
		}
		last := result.Messages[len(result.Messages)-1]
		if len(result.Messages) != 2 || result.Messages[0].GetRole() != "system" || last.GetContent() != demoQuestion {
			t.Fatalf("messages %v, want the injected system message and the question", result.Messages)
		}
		if result.FallbackReason != result.Metadata.GetFallbackReason() {
			t.Errorf("FallbackReason %q is not the service's %q", result.FallbackReason, result.Metadata.GetFallbackReason())
		}
		// A machine under load may make the service degrade (and say so); a full
		// assembly must have found the memory by meaning.
		if result.Metadata.GetDegradationLevel() == contextv1.DegradationLevel_DEGRADATION_LEVEL_FULL {
			if !strings.Contains(result.Messages[0].GetContent(), demoMemory) || !result.Metadata.GetDirectiveInjected() {
				t.Errorf("a full assembly without the directive or the dog: %q", result.Messages[0].GetContent())
			}
		}
	})

	t.Run("within 45 ms: the service's messages or the caller's", func(t *testing.T) {
		req := demoRequest("go-integration-2")

		result := capped.Assemble(context.Background(), req)

		if !result.FromService {
			if result.FallbackReason != ReasonTimeout {
				t.Errorf("fell back with %q (%v), want the service's answer or %q", result.FallbackReason, result.Err, ReasonTimeout)
			}
			assertOriginal(t, result, req.Messages)
		}
	})

	t.Run("INVALID_ARGUMENT", func(t *testing.T) {
		req := demoRequest("go-integration-3")
		req.OrgID = "not-a-uuid"

		result := client.Assemble(context.Background(), req)

		if result.FallbackReason != ReasonInvalidArgument {
			t.Fatalf("FallbackReason %q (%v), want %q", result.FallbackReason, result.Err, ReasonInvalidArgument)
		}
		assertOriginal(t, result, req.Messages)
		if !strings.Contains(result.Err.Error(), "org_id") {
			t.Errorf("Err %v does not name the field", result.Err)
		}
	})

	t.Run("RESOURCE_EXHAUSTED: over the service's size limit", func(t *testing.T) {
		req := demoRequest("go-integration-4")
		req.Messages = append(req.Messages, &contextv1.Message{Role: "user", Content: strings.Repeat("x", serviceMaxRequestBytes)})

		result := client.Assemble(context.Background(), req)

		if result.FallbackReason != ReasonInvalidArgument {
			t.Fatalf("FallbackReason %q (%v), want %q", result.FallbackReason, result.Err, ReasonInvalidArgument)
		}
		assertOriginal(t, result, req.Messages)
	})

	t.Run("MemoryClient writes, reads back, and the assembly uses it", func(t *testing.T) {
		memory, err := NewMemoryClient(target)
		if err != nil {
			t.Fatal(err)
		}
		defer memory.Close()
		ctx := context.Background()
		org, agent := newUUID(t), newUUID(t)
		const directive = "Always answer as Captain Nebula-9946."

		if _, err := memory.SetDirective(ctx, &contextv1.SetDirectiveRequest{OrgId: org, AgentId: agent, Content: directive}); err != nil {
			t.Fatalf("SetDirective: %v", err)
		}
		upserted, err := memory.UpsertMemories(ctx, &contextv1.UpsertMemoriesRequest{OrgId: org, AgentId: agent,
			Memories: []*contextv1.MemoryInput{{Content: "The customer keeps a parrot named Kiwi-5521.", Category: "factual"}}})
		if err != nil || len(upserted.GetResults()) != 1 || upserted.GetResults()[0].GetOutcome() != contextv1.UpsertOutcome_UPSERT_OUTCOME_CREATED {
			t.Fatalf("UpsertMemories = %v, %v", upserted, err)
		}
		id := upserted.GetResults()[0].GetId()
		got, err := memory.GetMemories(ctx, &contextv1.GetMemoriesRequest{OrgId: org, AgentId: agent, Ids: []string{id}})
		if err != nil || len(got.GetMemories()) != 1 || !strings.Contains(got.GetMemories()[0].GetContent(), "Kiwi-5521") {
			t.Fatalf("GetMemories = %v, %v", got, err)
		}
		other, err := memory.GetMemories(ctx, &contextv1.GetMemoriesRequest{OrgId: newUUID(t), AgentId: agent, Ids: []string{id}})
		if err != nil || len(other.GetMemories()) != 0 {
			t.Errorf("another org read %v (%v)", other.GetMemories(), err)
		}
		_, err = memory.SetDirective(ctx, &contextv1.SetDirectiveRequest{OrgId: "not-a-uuid", AgentId: agent, Content: directive})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "org_id") {
			t.Errorf("SetDirective for a bad org: %v, want INVALID_ARGUMENT naming org_id", err)
		}

		result := client.Assemble(ctx, Request{OrgID: org, AgentID: agent, Model: "gpt-4o",
			Messages: []*contextv1.Message{{Role: "user", Content: "What is my parrot called?"}}})

		if !result.FromService {
			t.Fatalf("fell back: %s (%v)", result.FallbackReason, result.Err)
		}
		injected := result.Messages[0].GetContent()
		if result.Metadata.GetDirectiveInjected() != strings.Contains(injected, directive) {
			t.Errorf("directive_injected=%v but the system message is %q", result.Metadata.GetDirectiveInjected(), injected)
		}
		if ids := result.Metadata.GetMemoryIds(); len(ids) > 0 && (ids[0] != id || !strings.Contains(injected, "Kiwi-5521")) {
			t.Errorf("injected %v, want the parrot %s", ids, id)
		}
	})

	t.Run("connections the server ages are replaced without a failed call", func(t *testing.T) {
		var dials atomic.Int32
		dialer := &net.Dialer{}
		aged := newTestClient(t, target, WithTimeout(generous), WithDialOptions(grpc.WithContextDialer(
			func(ctx context.Context, address string) (net.Conn, error) {
				dials.Add(1)
				return dialer.DialContext(ctx, "tcp", address)
			})))
		waitReady(t, aged)
		connected := dials.Load()

		for until := time.Now().Add(3 * connectionAge); time.Now().Before(until); time.Sleep(50 * time.Millisecond) {
			if result := aged.Assemble(context.Background(), demoRequest("go-integration-aged")); !result.FromService {
				t.Fatalf("a call fell back: %s (%v)", result.FallbackReason, result.Err)
			}
		}

		if dials.Load() <= connected {
			t.Errorf("%d connections made, none after the first %d: the server did not age them", dials.Load(), connected)
		}
	})

	t.Run("slow: frozen past the 45 ms cap", func(t *testing.T) {
		req := demoRequest("go-integration-5")
		service.Signal(t, syscall.SIGSTOP)
		defer service.Signal(t, syscall.SIGCONT)

		result := capped.Assemble(context.Background(), req)

		if result.FallbackReason != ReasonTimeout {
			t.Fatalf("FallbackReason %q (%v), want %q", result.FallbackReason, result.Err, ReasonTimeout)
		}
		assertOriginal(t, result, req.Messages)
	})

	t.Run("answers again once thawed", func(t *testing.T) {
		result := client.Assemble(context.Background(), demoRequest("go-integration-6"))

		if !result.FromService {
			t.Fatalf("fell back: %s (%v)", result.FallbackReason, result.Err)
		}
	})

	t.Run("down", func(t *testing.T) {
		service.ShutDown(t)
		fresh := newTestClient(t, target, WithTimeout(generous))

		for name, c := range map[string]*ContextClient{"connected before": client, "new": fresh} {
			req := demoRequest("go-integration-7")

			result := c.Assemble(context.Background(), req)

			if result.FallbackReason != ReasonUnavailable {
				t.Errorf("%s client: FallbackReason %q (%v), want %q", name, result.FallbackReason, result.Err, ReasonUnavailable)
			}
			assertOriginal(t, result, req.Messages)
		}
	})
}
